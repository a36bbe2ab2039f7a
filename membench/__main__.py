from membench.cli import main

raise SystemExit(main())
