"""Lints and renders a Helm chart with the Helm Go SDK (pip: helm-python-sdk).

Usage: python3 helm_check.py CHART_DIR [VALUES_JSON]
       python3 helm_check.py --package CHART_DIR

Prints one JSON object: {"lint": <lint report>, "manifests": {path: text},
"crds": [filename, ...], "objects": [every rendered object as JSON],
"validation": <schema check>}; with --package, packages the chart as
`helm package` does and prints the archive's regular files as {"files":
{path in the archive: text}}. Exits 3 when the SDK is not installed, so
the calling test can skip with a reason; any other failure exits non-zero
with the error on stderr.

The schema check validates every rendered object (and the chart's CRDs)
against the Kubernetes JSON schemas of KUBERNETES_VERSION with PyPI
`kubernetes-validate`, strict (unknown fields are errors): {"version": V,
"objects": ["Kind/name", ...], "errors": ["Kind/name: message", ...]}; it
is null when kubernetes-validate is not installed.
"""

import json
import sys
import tarfile
import tempfile

import yaml

try:
    import helm_python as helm
except ImportError:
    print("helm-python-sdk is not installed", file=sys.stderr)
    sys.exit(3)


# The newest schemas kubernetes-validate 1.34.1 ships (and the minor of the
# chart's default kube-scheduler image).
KUBERNETES_VERSION = "1.34.0"


def validate(texts):
    try:
        import kubernetes_validate
    except ImportError:
        return None
    objects, errors = [], []
    for text in texts:
        for doc in yaml.safe_load_all(text):
            if not doc:
                continue
            name = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            objects.append(name)
            try:
                kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = "/".join(str(p) for p in e.path)
                errors.append(f"{name}: at {path or '(top)'}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append(f"{name}: no schema: {e}")
    return {"version": KUBERNETES_VERSION, "objects": objects, "errors": errors}


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
    texts = [t for p, t in manifests.items() if not p.endswith(".txt")]
    texts += [c.get("data") or "" for c in chart.crds if isinstance(c, dict)]
    objects = [
        doc
        for p, t in manifests.items()
        if not p.endswith(".txt")
        for doc in yaml.safe_load_all(t)
        if doc
    ]
    validation = validate(texts)
    print(
        json.dumps(
            {
                "lint": report,
                "manifests": manifests,
                "crds": crds,
                "objects": objects,
                "validation": validation,
            }
        )
    )


main()
