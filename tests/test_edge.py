"""--gpu and --mesh are read once, at the edge, into typed values (membench.spec.gpu.Gpu, membench.spec.mesh.Mesh):
the CLI's argument types, and the spec for a record read back (`RunSpec.card`, `RunSpec.mesh_of`). Past it, code
takes a `Gpu` or a `Mesh`, never the text again. Counted from the syntax trees."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "membench"
READERS = {"gpu", "parse_mesh"}  # spec/gpu.py's --gpu reader and spec/mesh.py's --mesh reader
EDGE = ("membench/spec/", "membench/cli.py")


def reader_calls(root: Path) -> list[str]:
    """Every call of a reader, by plain name or as an attribute (`gpus.gpu(...)`), as 'path:line name'."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in READERS:
                    found.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno} {name}")
    return found


def test_gpu_and_mesh_text_is_read_at_the_edge_only():
    past = [call for call in reader_calls(PACKAGE) if not call.startswith(EDGE)]
    assert not past, "--gpu or --mesh text read past the edge (take the Gpu or Mesh instead):\n" + "\n".join(past)
    cli = [call for call in reader_calls(PACKAGE) if call.startswith("membench/cli.py")]
    assert sorted(c.split()[1] for c in cli) == ["gpu", "parse_mesh"]  # one argument type each


def test_the_count_sees_a_reader_called_past_the_edge(tmp_path):
    pkg = tmp_path / "membench"
    (pkg / "predict").mkdir(parents=True)
    (pkg / "predict" / "run.py").write_text("from membench.predict import gpus\n\n\ndef f(spec):\n"
                                            "    return gpus.gpu(spec.gpu), parse_mesh(spec.mesh)\n")
    assert reader_calls(pkg) == ["membench/predict/run.py:5 gpu", "membench/predict/run.py:5 parse_mesh"]


def test_the_api_takes_a_gpu_and_a_mesh_and_the_record_keeps_their_names():
    from membench.plan import plan
    from membench.spec.gpu import gpu
    from membench.spec.mesh import Mesh

    [_, fsdp] = plan("gpt-tiny", "fsdp", 2, target_device="cuda", in_process=True, gpu=gpu("nvidia l40s"),
                     mesh=Mesh(dp_shard=2), nproc_per_node=2)
    assert (fsdp.run.gpu, fsdp.run.mesh) == ("L40S", "dp_shard=2")
    assert fsdp.run.card is gpu("L40S") and fsdp.run.mesh_of(2) == Mesh(dp_shard=2)
    assert fsdp.to_dict()["run"]["gpu"] == "L40S"
