"""The harness, in floors; each imports only its own floor and the ones below it
(tests/test_import_directions.py holds the list):

- front ends: the commands (`command`, `serve_command`, `repro_command`, `lanes_command`),
  the pytest plugin (`pytest_plugin`) and the published JSON Schemas (`schema_files`);
- level: `level.run_level` (a level's run), `lanes`, `repro` and `repro_dump`, `progress`;
- executor: `executor.CaseExecutor` and the scheduler that shares cases among workers;
- workers/: every process and speed module (worker processes, the zygote, served workers,
  MPS, the early CUDA context, the warm case path, bytecode, the speed switches);
- case: `case.run_case`, one case from the engine's answer to its verdict;
- judging: materialize, the oracles, the checks, diagnose, config, verdicts, results,
  bundles, selection, the input distributions and a junit file's Markdown summary
  (`job_summary`)."""
