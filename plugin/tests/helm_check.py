"""Lints and renders a Helm chart with the Helm Go SDK (pip: helm-python-sdk).

Usage: python3 helm_check.py CHART_DIR [VALUES_JSON]
       python3 helm_check.py --package CHART_DIR

Prints one JSON object: {"lint": <lint report>, "manifests": {path: text},
"crds": [filename, ...]}; with --package, packages the chart as
`helm package` does and prints the archive's regular files as {"files":
{path in the archive: text}}. Exits 3 when the SDK is not installed, so
the calling test can skip with a reason; any other failure exits non-zero
with the error on stderr.
"""

import json
import sys
import tarfile
import tempfile

try:
    import helm_python as helm
except ImportError:
    print("helm-python-sdk is not installed", file=sys.stderr)
    sys.exit(3)


def package(chart_dir: str) -> None:
    with tempfile.TemporaryDirectory() as out:
        archive = helm.package(chart_dir, destination=out)
        with tarfile.open(archive) as tar:
            files = {
                m.name: tar.extractfile(m).read().decode()
                for m in tar.getmembers()
                if m.isfile()
            }
    print(json.dumps({"files": files}))


def main() -> None:
    if sys.argv[1] == "--package":
        package(sys.argv[2])
        return
    chart_dir = sys.argv[1]
    values = json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
    report = helm.lint(chart_dir, values, strict=True, namespace="tessera-system")
    chart = helm.Chart.load(chart_dir)
    manifests = chart.render(
        values, name="tessera", namespace="tessera-system", is_install=True
    )
    crds = [c.get("name") or c.get("filename") or str(c) for c in chart.crds]
    print(json.dumps({"lint": report, "manifests": manifests, "crds": crds}))


main()
