"""The HTML report in a real headless browser (Chromium): it loads from disk with no console
message, every plot decodes, the failing case ids and their repro commands are on the page,
and at 400 px nothing overflows the page sideways (wide plots and tables scroll in their
own box). Skipped only when no Chromium binary is installed."""
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from bundlegen.claims.report import repro_command, write_report
from tests.test_claims_report import AXES, fixture_runs

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
BROWSER = next((path for name in BROWSERS if (path := shutil.which(name))), None)
REPO_ROOT = Path(__file__).resolve().parents[1]
H200_FAILING_RUNS = tuple(REPO_ROOT / "evidence" / "h200" / f"torch-cudnn-full-{n}.results.jsonl.gz" for n in (1, 2))

pytestmark = pytest.mark.skipif(BROWSER is None, reason=f"no browser binary installed (looked for {', '.join(BROWSERS)})")

# Measures the page after load; only the test's copy of the report carries it. `html` is held
# at 400 px because headless Chromium's --dump-dom window is never narrower than 500 px.
PROBE = """<style>html { width: 400px; }</style><script>
window.addEventListener("load", () => {
  const outside = [...document.querySelectorAll("body *")].filter(e => !e.parentElement.closest(".scroll"));
  const right = Math.max(...outside.map(e => e.getBoundingClientRect().right));
  const images = [...document.images];
  // every in-page link: its target exists, and is shown (a folded group still shows its summary)
  const links = [...document.querySelectorAll('a[href^="#"]')].map(a => a.getAttribute("href").slice(1));
  const unresolved = links.filter(id => !document.getElementById(id));
  const hidden = links.filter(id => { const e = document.getElementById(id);
                                      return e && e.getBoundingClientRect().height === 0; });
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({right: right, images: images.length,
                                      decoded: images.filter(i => i.complete && i.naturalWidth > 0).length,
                                      links: links, unresolved: unresolved, hidden: hidden});
  document.body.appendChild(probe);
});
</script>"""


def load(page: Path, width: int = 400) -> tuple[str, list[str]]:
    """The DOM after load and every console message the page logged."""
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             "--enable-logging=stderr", "--v=0", f"--window-size={width},1200", "--dump-dom", page.as_uri()],
            capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def probed(report: Path, tmp_path: Path) -> dict:
    copy = tmp_path / "probed.html"
    copy.write_text(report.read_text(encoding="utf-8").replace("</head>", PROBE + "</head>", 1), encoding="utf-8")
    dom, console = load(copy)
    assert not console, console
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    return json.loads(dom[start:dom.index("</pre>", start)].replace("&quot;", '"'))


def test_the_console_check_sees_errors(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text('<!doctype html><html lang="en"><body><script>console.error("broken-on-purpose")</script>'
                    "</body></html>", encoding="utf-8")
    _, console = load(page)
    assert any("broken-on-purpose" in line for line in console)


def test_the_overflow_probe_sees_a_page_wider_than_400_px(tmp_path):
    page = tmp_path / "wide.html"
    page.write_text('<!doctype html><html lang="en"><head></head><body><div style="width: 900px">x</div>'
                    "</body></html>", encoding="utf-8")
    assert probed(page, tmp_path)["right"] > 400


def test_the_link_probe_sees_a_link_to_nowhere(tmp_path):
    page = tmp_path / "links.html"
    page.write_text('<!doctype html><html lang="en"><head></head><body><a href="#here">a</a><a href="#gone">b</a>'
                    '<p id="here">x</p><div id="empty"></div><a href="#empty">c</a></body></html>', encoding="utf-8")
    probe = probed(page, tmp_path)
    assert probe["links"] == ["here", "gone", "empty"]
    assert probe["unresolved"] == ["gone"] and probe["hidden"] == ["empty"]


def assert_contents_resolve(probe: dict, groups: int) -> None:
    """The table of contents reaches every failure group, the verdict table and every plot."""
    links = probe["links"]
    assert {"failing", "verdicts", "margins", "pairs", "cost"} <= set(links), links
    assert sum(link.startswith("failing-") for link in links) == groups, links
    assert not probe["unresolved"] and not probe["hidden"], probe


def test_the_report_in_a_browser(tmp_path):
    report = write_report(fixture_runs(), ["r.jsonl"], tmp_path / "fixture.html", min_margin=1.5, axes=AXES)
    dom, console = load(report)
    assert not console, console
    for case_id in ("f00dfeedbeef", "cafe00000001"):
        assert case_id in dom
    assert repro_command("f00dfeedbeef", "torch-flash", "cuda") in dom
    probe = probed(report, tmp_path)
    assert probe["images"] == 4 and probe["decoded"] == 4
    assert probe["right"] <= 400, probe
    assert_contents_resolve(probe, groups=4)         # two engines, one item group each


def test_the_report_of_h200_results_in_a_browser(tmp_path):
    """Two real runs of the cuDNN engine on an H200, with the failures they hold: every failing
    case is on the page, after the contents and before the verdict table, each the bundles
    still hold with its graph in one line, and every link of the contents resolves."""
    from bundlegen.claims.cases import graph_lines
    from bundlegen.claims.harvest import read_run
    from bundlegen.claims.report import core_axes, failing_cases, failure_groups
    from bundlegen.harness.verdicts import FAILING
    from bundlegen.manifest import load_manifest
    from bundlegen.workspace import builtin_bundle_root

    runs = [read_run(path) for path in H200_FAILING_RUNS]
    failing = {r["case_id"] for run in runs for r in run if r["verdict"] in FAILING}
    assert failing, "the H200 runs hold no failing case: pick runs that do"
    graphs = graph_lines(builtin_bundle_root(), "sdpa_bwd", failing)
    sources = [str(path.relative_to(REPO_ROOT)) for path in H200_FAILING_RUNS]
    report = write_report(runs, sources, tmp_path / "h200.html", min_margin=1.5,
                          axes=core_axes(load_manifest(builtin_bundle_root())), graphs=graphs)
    dom, console = load(report)
    assert not console, console
    assert all(case_id in dom for case_id in failing)
    assert dom.index('id="contents"') < dom.index(sorted(failing)[0]) < dom.index('id="verdicts"')
    # a failing case the plan has retired since the run is on the page without its graph
    assert graphs and set(graphs) <= failing
    assert all(line.split(" | ")[0] in dom for line in graphs.values())
    probe = probed(report, tmp_path)
    assert probe["images"] == probe["decoded"] == 3      # margins, one pair map, cost
    assert probe["right"] <= 400, probe
    records = [r for run in runs for r in run]
    groups = failure_groups(failing_cases(runs, sources), records)
    assert_contents_resolve(probe, groups=len(groups) + sum(len(e.groups) for e in groups))


def test_many_failures_fold_into_groups_the_contents_still_reach(tmp_path):
    """Past OPEN_UP_TO failing cases the groups are folded: the page stays short, and each
    link of the contents still lands on its group's visible summary."""
    from bundlegen.claims.report import OPEN_UP_TO
    from tests.test_claims_report import rec

    records = [rec(f"{n:012x}", verdict="fail:numeric", items=("AX-DTYPE-BF16", f"REG-{n % 3}"))
               for n in range(OPEN_UP_TO + 5)]
    report = write_report([records], ["r.jsonl"], tmp_path / "many.html", min_margin=1.5, axes=AXES)
    html = report.read_text(encoding="utf-8")
    assert html.count("<details class=\"group\"") == 3 and " open>" not in html
    probe = probed(report, tmp_path)
    assert_contents_resolve(probe, groups=1 + 3)
    assert probe["right"] <= 400, probe
