"""Claims and the support matrix (DESIGN section 7).

- `bundlegen.claims.store`: engines/<name>/claims.json, read and written canonically.
- `bundlegen.claims.harvest`: results.jsonl files -> claims (and the declines the matrix shows).
- `bundlegen.claims.matrix`: plan items x (engine, arch) cells, rendered to SUPPORT_MATRIX.md.
- `bundlegen.claims.report`: an HTML report of results with plots.
Each has a thin `*_command` module for the `bundlegen` CLI.
"""
