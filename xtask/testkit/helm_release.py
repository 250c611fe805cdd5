"""Installs, upgrades, removes or reports a Helm release on a cluster with
the Helm Go SDK (pip: helm-python-sdk), as `helm install`, `helm upgrade
--install`, `helm uninstall` and `helm status` do: CRDs first, then the
rendered objects, the release stored in the namespace's Secrets.

Usage:
  python3 helm_release.py install KUBECONFIG NAMESPACE RELEASE CHART_DIR [VALUES_JSON] [TIMEOUT_S] [VALUES_FILE...]
  python3 helm_release.py uninstall KUBECONFIG NAMESPACE RELEASE [TIMEOUT_S]
  python3 helm_release.py status KUBECONFIG NAMESPACE RELEASE

`install` installs the release, or upgrades it when it exists (so it can
be run twice), with VALUES_JSON and then each VALUES_FILE (YAML) merged
over it as `helm -f` merges, waiting up to TIMEOUT_S (default 300) for its workloads to
be ready. It prints one JSON object: {"name", "namespace", "revision",
"status"}; `status` prints the same, with "status": null when there is no
such release. Exits 3 when the SDK is not installed (the caller says why
it skips); any other failure exits 1 with the SDK's error on stderr.
"""

import json
import sys

import yaml

try:
    import helm_python as helm
except ImportError:
    print("helm-python-sdk is not installed", file=sys.stderr)
    sys.exit(3)


def summary(release, namespace):
    info = release.get("info") if isinstance(release, dict) else None
    body = release.get("release", release) if isinstance(release, dict) else {}
    status = (body.get("info") or {}).get("status") or (info or {}).get("status")
    return {
        "name": body.get("name"),
        "namespace": body.get("namespace", namespace),
        "revision": body.get("version"),
        "status": status,
    }


def merge(base, over):
    """`over` merged into `base`: maps key by key, anything else replaced."""
    if not (isinstance(base, dict) and isinstance(over, dict)):
        return over
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(base.get(k), v) if k in base else v
    return out


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    action, kubeconfig, namespace, release = argv[0], argv[1], argv[2], argv[3]
    config = helm.Config(kubeconfig_path=kubeconfig, namespace=namespace)
    if action == "install":
        if len(argv) < 5:
            print("install needs CHART_DIR", file=sys.stderr)
            return 2
        chart = helm.Chart.load(argv[4])
        values = json.loads(argv[5]) if len(argv) > 5 and argv[5] else {}
        timeout = int(argv[6]) if len(argv) > 6 else 300
        for path in argv[7:]:
            with open(path) as f:
                values = merge(values, yaml.safe_load(f) or {})
        try:
            config.status(release)
            exists = True
        except helm.HelmNotFoundError:
            exists = False
        if exists:
            out = config.upgrade(
                chart, release, values, namespace=namespace, timeout=timeout,
                wait="watcher",
            )
        else:
            out = config.install(
                chart, release, values, namespace=namespace, timeout=timeout,
                wait="watcher", create_namespace=True,
            )
        print(json.dumps(summary(out, namespace)))
    elif action == "uninstall":
        timeout = int(argv[4]) if len(argv) > 4 else 120
        config.uninstall(release, timeout=timeout, ignore_not_found=True, wait="watcher")
        print(json.dumps({"name": release, "namespace": namespace, "status": "uninstalled"}))
    elif action == "status":
        try:
            out = config.status(release)
        except helm.HelmNotFoundError:
            print(json.dumps({"name": release, "namespace": namespace, "status": None}))
            return 0
        print(json.dumps(summary(out, namespace)))
    else:
        print(f"unknown action {action!r}: install, uninstall or status", file=sys.stderr)
        return 2
    return 0


try:
    sys.exit(main(sys.argv[1:]))
except helm.HelmError as e:
    print(f"helm: {e}", file=sys.stderr)
    sys.exit(1)
