"""The Kubernetes manifests in deploy/kubernetes/ are what a cluster would accept, checked
offline: every object against the Kubernetes JSON schemas (``kubernetes-validate``, which
ships them in its wheel; strict, so an unknown field fails as the API server would refuse
it), and the manifests against each other (every Secret, ConfigMap and key a pod names
exists; Services, the PodDisruptionBudget and the NetworkPolicy select the pods they are
for; the files the configs name are where the pods mount them). Each check is also shown
to fail on a manifest broken on purpose."""

from __future__ import annotations

import base64
import copy
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from agentbox.config.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[2]
KDIR = ROOT / "deploy" / "kubernetes"
# The oldest release the manifests support (securityContext.appArmorProfile is 1.30) and
# the newest whose schemas the pinned kubernetes-validate ships.
VERSIONS = ["1.30", "1.37"]
# Custom resources in examples/ have no schema in the wheel: their operator validates them.
CUSTOM = {("postgresql.cnpg.io/v1", "Cluster")}
Obj = dict[str, Any]


def documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def kustomization() -> Obj:
    return documents(KDIR / "kustomization.yaml")[0]


def applied() -> list[Obj]:
    """The objects ``kubectl apply -k`` creates: the resources, the generated Secrets (with
    stand-in values for the files an installation makes), in kustomization's namespace."""
    k = kustomization()
    objs = [d for r in k["resources"] for d in documents(KDIR / r)]
    objs += [generated_secret(g) for g in k["secretGenerator"]]
    for obj in objs:
        if obj["kind"] != "Namespace":
            obj["metadata"].setdefault("namespace", k["namespace"])
    return objs


def generated_secret(generator: Obj) -> Obj:
    keys = [f.split("=", 1)[0] for f in generator.get("files", [])]
    keys += ["AWS_ACCESS_KEY_ID"] if generator.get("envs") else []
    data = {key: base64.b64encode(b"stand-in").decode() for key in keys}
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": generator["name"]}}
    return {**secret, "type": generator.get("type", "Opaque"), "data": data}


def schema_errors(objs: list[Obj], version: str) -> list[str]:
    errors = []
    for obj in objs:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {e.message}")
    return errors


def pod_specs(objs: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    for obj in objs:
        if obj["kind"] in ("Deployment", "DaemonSet", "Job"):
            yield obj, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "CronJob":
            yield obj, obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def pod_labels(objs: list[Obj], kind: str) -> dict[str, str]:
    (workload,) = [o for o in objs if o["kind"] == kind]
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def secret_keys(objs: list[Obj]) -> dict[str, set[str]]:
    return {o["metadata"]["name"]: set(o["data"]) for o in objs if o["kind"] == "Secret"}


def reference_errors(objs: list[Obj]) -> list[str]:
    """What the pods name that the manifests do not make."""
    secrets = secret_keys(objs)
    maps = {o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"}
    accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    errors = []
    for workload, spec in pod_specs(objs):
        where = f"{workload['kind']}/{workload['metadata']['name']}"
        if spec["serviceAccountName"] not in accounts:
            errors.append(f"{where}: no ServiceAccount {spec['serviceAccountName']}")
        for volume in spec.get("volumes", []):
            names = [volume["secret"]["secretName"]] if "secret" in volume else []
            names += [s["secret"]["name"] for s in volume.get("projected", {}).get("sources", [])]
            errors += [f"{where}: no Secret {n}" for n in names if n not in secrets]
            if "configMap" in volume and volume["configMap"]["name"] not in maps:
                errors.append(f"{where}: no ConfigMap {volume['configMap']['name']}")
        for container in spec["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["key"] not in secrets.get(ref["name"], set()):
                    errors.append(f"{where}: no key {ref['key']} in Secret {ref['name']}")
            for source in container.get("envFrom", []):
                if source["secretRef"]["name"] not in secrets:
                    errors.append(f"{where}: no Secret {source['secretRef']['name']}")
    return errors


def selector_errors(objs: list[Obj]) -> list[str]:
    """Services, the PDB and the NetworkPolicies each select the pods they are for."""
    node, gateway = pod_labels(objs, "DaemonSet"), pod_labels(objs, "Deployment")
    wanted = {
        ("Service", "agentbox-node"): node,
        ("Service", "agentbox-gateway"): gateway,
        ("PodDisruptionBudget", "agentbox-gateway"): gateway,
        ("NetworkPolicy", "agentbox-node-api"): node,
        ("NetworkPolicy", "agentbox-gateway-api"): gateway,
    }
    errors = []
    for obj in objs:
        labels = wanted.pop((obj["kind"], obj["metadata"]["name"]), None)
        if labels is None:
            continue
        spec = obj["spec"]
        selector = spec["selector"] if obj["kind"] == "Service" else None
        selector = selector or spec.get("selector", spec.get("podSelector", {})).get("matchLabels")
        if not selects(selector, labels):
            errors.append(f"{obj['kind']}/{obj['metadata']['name']} selects {selector}")
    errors += [f"missing {kind}/{name}" for kind, name in wanted]
    return errors


def config_files(objs: list[Obj]) -> dict[str, Obj]:
    (config,) = [o for o in objs if o["kind"] == "ConfigMap"]
    return {name: yaml.safe_load(text) for name, text in config["data"].items()}


def mounted_files(objs: list[Obj], spec: Obj) -> set[str]:
    """Every file the pod sees from its Secrets: mount path + key."""
    secrets = secret_keys(objs)
    by_volume: dict[str, set[str]] = {}
    for volume in spec["volumes"]:
        names = [volume["secret"]["secretName"]] if "secret" in volume else []
        names += [s["secret"]["name"] for s in volume.get("projected", {}).get("sources", [])]
        by_volume[volume["name"]] = {k for n in names for k in secrets.get(n, set())}
    return {
        f"{m['mountPath']}/{key}"
        for c in spec["containers"]
        for m in c.get("volumeMounts", [])
        for key in by_volume.get(m["name"], set())
    }


def config_path_errors(objs: list[Obj]) -> list[str]:
    """The certificate files each role's config names are mounted in its pods."""
    configs = config_files(objs)
    role = {"DaemonSet": "node.yaml", "Deployment": "gateway.yaml"}  # the Job: state only
    errors = []
    for workload, spec in pod_specs(objs):
        if workload["kind"] not in role:
            continue
        config = configs[role[workload["kind"]]]
        named = [config["cluster"][k] for k in ("ca_file", "cert_file", "key_file")]
        named += list(config["gateway"].get("tls", {}).values())
        files = mounted_files(objs, spec)
        errors += [f"{workload['kind']}: {p} not mounted" for p in named if p not in files]
    return errors


# --- the manifests as committed ---------------------------------------------------------


def test_every_manifest_is_applied_or_an_example() -> None:
    listed = set(kustomization()["resources"])
    on_disk = {p.name for p in KDIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    kinds = {o["kind"] for o in applied()}
    assert {"DaemonSet", "Deployment", "Service", "PodDisruptionBudget", "ConfigMap"} <= kinds
    assert {"Secret", "Job", "CronJob", "NetworkPolicy"} <= kinds


def test_the_one_off_and_scheduled_commands_are_the_clis() -> None:
    """The Job's and the CronJob's command lines are ones `agentbox` takes (a renamed
    command or option would fail only when the cluster runs them), with the gateway's
    config, which for the prune sets the retention it needs."""
    from click.testing import CliRunner

    from agentbox.cli.main import cli

    objs = applied()
    runs = {o["kind"]: c for o, spec in pod_specs(objs) for c in spec["containers"]
            if o["kind"] in ("Job", "CronJob")}  # fmt: skip
    assert set(runs) == {"Job", "CronJob"}
    for kind, container in runs.items():
        assert container["command"] == ["agentbox"], kind
        args = container["args"]
        words = [a for a in args if not a.startswith("-")][:2]
        shown = CliRunner().invoke(cli, [*words, "--help"])
        assert shown.exit_code == 0, (kind, shown.output)
        assert all(a in shown.output for a in args if a.startswith("--")), (kind, args)
        assert args[args.index("--config") + 1] == "/etc/agentbox/config/gateway.yaml"
    assert runs["CronJob"]["args"][:3] == ["audit", "prune", "--cluster"]
    cluster = config_files(objs)["gateway.yaml"]["cluster"]
    assert cluster["audit_retention_days"] > 0


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_matches_the_kubernetes_schemas(version: str) -> None:
    assert schema_errors(applied(), version) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_the_examples_match_theirs(version: str) -> None:
    examples = sorted((KDIR / "examples").glob("*.yaml"))
    assert examples
    daemonset = documents(KDIR / "node-daemonset.yaml")[0]
    for path in examples:
        for obj in documents(path):
            if (obj["apiVersion"], obj["kind"]) in CUSTOM:
                with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                    kubernetes_validate.validate(obj, version, strict=True)
                continue
            # A patch is checked as what it makes of the DaemonSet it is merged into.
            whole = merged(daemonset, obj) if path.name.endswith(".patch.yaml") else obj
            assert schema_errors([whole], version) == [], path.name


def merged(base: Obj, patch: Obj) -> Obj:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def test_what_the_pods_name_exists() -> None:
    assert reference_errors(applied()) == []


def test_services_budgets_and_policies_select_their_pods() -> None:
    assert selector_errors(applied()) == []


def test_the_node_api_admits_gateway_pods_only() -> None:
    objs = applied()
    (policy,) = [o for o in objs if o["metadata"]["name"] == "agentbox-node-api"]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # no namespaceSelector / ipBlock widening it
    assert selects(peer["podSelector"]["matchLabels"], pod_labels(objs, "Deployment"))
    assert rule["ports"] == [{"protocol": "TCP", "port": 8849}]
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_the_configs_are_gateway_configs_and_name_mounted_files() -> None:
    objs = applied()
    configs = config_files(objs)
    assert set(configs) == {"gateway.yaml", "node.yaml"}
    assert "cluster" in GatewaySettings.model_fields, "needs cluster mode (docs/cluster.md)"
    for name, config in configs.items():
        # agentbox's own strict settings model: an unknown key fails, as at start. The
        # node's placeholders are what its pod's start command fills in.
        text = yaml.safe_dump(config).replace("@NODE_ID@", "worker-1")
        text = text.replace("@ADVERTISE_HOST@", "10-0-0-5.agentbox-node.agentbox.svc")
        settings = GatewaySettings.model_validate(yaml.safe_load(text))
        assert settings.cluster is not None, name
        assert (settings.cluster.node is not None) == (name == "node.yaml")
    assert config_path_errors(objs) == []


def test_the_node_start_command_fills_in_its_id_and_name(tmp_path: Path) -> None:
    # The DaemonSet's own shell script, run with a pod's environment; only the cgroup move
    # (which would move this test's process) is left out, and the exec prints the config.
    assert "cluster" in GatewaySettings.model_fields, "needs cluster mode (docs/cluster.md)"
    objs = applied()
    (container,) = find(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    script = container["args"][0]
    start, end = script.index("if [ -w /sys/fs/cgroup"), script.index("fi\n") + 3
    template = tmp_path / "node.yaml"
    template.write_text(find(objs, "ConfigMap")["data"]["node.yaml"])
    script = (script[:start] + script[end:]).replace("/etc/agentbox/config/", f"{tmp_path}/")
    script = script.replace("/run/agentbox/", f"{tmp_path}/out-")
    script = script.replace("exec agentbox node --config", "cat")
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    env |= {"NODE_NAME": "Worker-7.example.com", "POD_IP": "10.42.3.17"}
    env |= {"POD_NAMESPACE": "agentbox", "PATH": os.environ["PATH"]}
    done = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, check=True
    )
    settings = GatewaySettings.model_validate(yaml.safe_load(done.stdout))
    assert settings.cluster is not None and settings.cluster.node is not None
    assert settings.cluster.node.id == "worker-7-example-com"
    assert settings.cluster.node.advertise == (
        "https://10-42-3-17.agentbox-node.agentbox.svc.cluster.local:8849"
    )


def test_the_database_host_is_the_example_cnpg_cluster() -> None:
    (cnpg,) = documents(KDIR / "examples" / "cnpg-cluster.yaml")
    for config in config_files(applied()).values():
        assert f"@{cnpg['metadata']['name']}-rw." in config["gateway"]["state"]


def test_only_the_node_is_privileged() -> None:
    for workload, spec in pod_specs(applied()):
        (container,) = spec["containers"]
        context = container["securityContext"]
        if workload["kind"] == "DaemonSet":
            assert context["privileged"] is True
            assert spec["hostNetwork"] is False  # NetworkPolicy applies; veths stay in the pod
        else:
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False


# --- each check can fail -------------------------------------------------------------------


def find(objs: list[Obj], kind: str) -> Obj:
    return next(o for o in objs if o["kind"] == kind)


def container_of(objs: list[Obj], kind: str) -> Obj:
    container: Obj = find(objs, kind)["spec"]["template"]["spec"]["containers"][0]
    return container


BROKEN_SCHEMA = {
    "misspelt field": lambda objs: container_of(objs, "Deployment").update(imagePullPolcy="Always"),
    "wrong type": lambda objs: find(objs, "Deployment")["spec"].update(replicas="two"),
    "missing required": lambda objs: container_of(objs, "DaemonSet").pop("name"),
    "bad enum in a PDB": lambda objs: find(objs, "PodDisruptionBudget")["spec"].update(
        unhealthyPodEvictionPolicy=7
    ),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("breakage", sorted(BROKEN_SCHEMA))
def test_the_schema_check_fails_on_a_broken_manifest(breakage: str, version: str) -> None:
    objs = applied()
    BROKEN_SCHEMA[breakage](objs)
    assert len(schema_errors(objs, version)) == 1


def test_the_reference_checks_fail_on_broken_manifests() -> None:
    objs = applied()
    container_of(objs, "Deployment")["env"][1]["valueFrom"]["secretKeyRef"]["key"] = "pass"
    assert reference_errors(objs) == [
        "Deployment/agentbox-gateway: no key pass in Secret agentbox-postgres"
    ]

    objs = applied()
    find(objs, "Service")["spec"]["selector"]["app.kubernetes.io/component"] = "gw"
    assert len(selector_errors(objs)) == 1

    objs = applied()
    find(objs, "ConfigMap")["data"]["gateway.yaml"] = find(objs, "ConfigMap")["data"][
        "gateway.yaml"
    ].replace("gateway.pem", "gw.pem")
    assert config_path_errors(objs) == ["Deployment: /etc/agentbox/cluster/gw.pem not mounted"]
