import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _importable_tests(monkeypatch):
    """Worker subprocesses import user workloads such as tests.workloads:mlp from the repository root."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


# End-to-end checks of 5 s or more each on the 2-core CPU machine (pytest --durations, torch 2.14.1), whose
# behaviour a faster test also exercises: marked slow, so that README's test command stays within minutes.
# `python -m pytest -q -m slow` runs them; .ci/run runs both.
SLOW = {
    "tests/test_readme.py::test_examples_run_as_printed[workloads.md]",
    "tests/test_sweep.py::test_sweep_writes_one_result_per_run_with_spec_and_environment",
    "tests/test_isolation.py::test_a_bad_factory_is_one_line_before_anything_runs[factory_hangs-did not load within 30 s]",  # noqa: E501
    "tests/test_sweep.py::test_resume_skips_finished_runs_and_reruns_keep_history",
    "tests/test_pytest_plugin.py::test_save_then_compare_passes_then_a_growth_fails",
    "tests/test_sweep.py::test_python_api_returns_a_dataframe",
    "tests/test_sweep.py::test_oom_in_one_run_keeps_the_others",
    "tests/test_harden.py::test_resume_reuses_only_runs_measured_with_the_same_spec",
    "tests/test_isolation.py::test_a_leak_during_the_timed_steps_passes_no_budget",
    "tests/test_harden.py::test_a_rerun_archives_the_result_with_its_timeline",
    "tests/test_sweep.py::test_crash_and_hang_become_statuses",
    "tests/test_users.py::test_run_ends_by_naming_the_report_file_to_open",
    "tests/test_harden.py::test_a_prediction_never_replaces_a_measurement",
    "tests/test_harden.py::test_a_symlinked_folder_inside_out_is_refused_and_the_result_kept[runs]",
    "tests/test_harden.py::test_full_disk_during_a_sweep_is_one_line_and_keeps_finished_runs[30]",
    "tests/test_users.py::test_fit_shows_each_prediction_as_it_goes",
    "tests/test_harden.py::test_a_nan_loss_is_diverged_and_the_json_is_strict",
    "tests/test_pytest_plugin.py::test_usage_errors_are_one_line",
    "tests/test_harden.py::test_a_second_writer_is_refused_and_a_killed_ones_lock_is_released",
    "tests/test_predict.py::test_cuda_only_techniques_are_validated_against_the_target_not_this_cpu",
    "tests/test_users.py::test_run_sweep_takes_a_model_function_and_runs_each_in_a_forked_child",
    "tests/test_sweep.py::test_ctrl_c_keeps_finished_runs",
    "tests/test_harden.py::test_a_new_prediction_archives_the_earlier_one",
    "tests/test_users.py::test_module_factory_resolves_from_the_working_directory_and_default_techniques_fit_the_model",  # noqa: E501
    "tests/test_harden.py::test_full_disk_while_writing_a_report_is_one_line",
    "tests/test_harden.py::test_a_symlinked_log_is_replaced_not_truncated",
    "tests/test_harden.py::test_a_factory_that_changes_directory_does_not_move_a_relative_out",
    "tests/test_users.py::test_missing_transformers_is_one_line",
    "tests/test_harden.py::test_sigterm_stops_the_sweep_like_ctrl_c",
    "tests/test_pytest_plugin.py::test_weights_made_before_the_block_are_not_counted",
    "tests/test_users.py::test_a_workload_names_its_default_optimizer_and_the_flag_overrides_it",
    "tests/test_users.py::test_a_crash_in_a_notebook_model_ends_only_its_forked_run",
    # The CI recipe (a sweep, a check, a gate) end to end; README.md's own examples stay in the default run.
    "tests/test_readme.py::test_examples_run_as_printed[ci.md]",
    # The oracle on a 12-layer model; the same path on vit-tiny, gpt-tiny and cnn-bn stays in the default run.
    "tests/test_oracle.py::test_peak_agrees_with_torch_memtracker_to_the_byte[vit-small-baseline]",
    # Waits out --timeout's 30 s floor; the other bad factories of predict and fit stay in the default run.
    "tests/test_fit.py::test_a_bad_factory_is_one_line_and_exit_2[predict-factory_hangs-did not finish within 30 s (--timeout)]",  # noqa: E501
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.nodeid in SLOW:
            item.add_marker(pytest.mark.slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; torch sees none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
