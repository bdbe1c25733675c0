"""Claims and the support matrix (DESIGN section 7).

- `bundlegen.claims.store`: engines/<name>/claims.json, read and written canonically.
- `bundlegen.claims.harvest`: results files -> claims (with the declines, why the rest is
  unclaimed, and the evidence: which results files, by sha256).
- `bundlegen.claims.cases`: what the bundles say about cases (items, levels).
- `bundlegen.claims.integrity`: every claim backed by the results it cites (`matrix --check`).
- `bundlegen.claims.matrix`: plan items x (engine, arch) cells, rendered to SUPPORT_MATRIX.md.
- `bundlegen.claims.report`: one self-contained HTML report of results, failing cases first.
Each has a thin `*_command` module for the `bundlegen` CLI.
"""
