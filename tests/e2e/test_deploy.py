"""The deployment files, checked offline on every run: the Dockerfiles pass hadolint, both
Kubernetes overlays (and the autoscaling component) render with `kubectl kustomize` and every
object validates against the Kubernetes schema, the manifests agree with the policies they
mount, every shipped deployment policy passes `approxy check`, and the compose file's
Prometheus configuration passes promtool. hadolint, kubectl and kubernetes-validate come from
PyPI in the test venv (tests/e2e/requirements.txt): Debian 12's kubectl (kubernetes-client
1.20) predates the kustomize this needs. Building and running the images is
deploy/image/build.sh and deploy/image/smoke.sh (deploy/README.md, "Running in production")."""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
import yaml

from conftest import BIN, REPO

TOOLS = pathlib.Path(sys.executable).parent
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
PROMTOOL = os.environ.get("APPROXY_PROMTOOL_BIN")


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "image/targets.Dockerfile"])
def test_the_dockerfiles_pass_hadolint(dockerfile):
    r = run(TOOLS / "hadolint", DEPLOY / dockerfile)
    assert r.returncode == 0, r.stdout + r.stderr


def test_hadolint_does_fail_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get install curl\n")
    r = run(TOOLS / "hadolint", bad)
    assert r.returncode != 0 and "DL3006" in r.stdout, r.stdout + r.stderr


@pytest.fixture(scope="module")
def k8s(tmp_path_factory):
    """A copy of deploy/k8s with each overlay's keys.env made from its example (as a user
    does first), and one more kustomization: the local overlay with the saturation component."""
    root = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, root)
    for example in root.glob("overlays/*/keys.env.example"):
        shutil.copy(example, example.with_suffix(""))
    extra = root / "overlays" / "local-target-saturation"
    extra.mkdir()
    (extra / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [../local-target]\ncomponents: [../../components/scale-on-saturation]\n")
    return root


def render(k8s, overlay):
    r = run(TOOLS / "kubectl", "kustomize", k8s / "overlays" / overlay)
    assert r.returncode == 0, r.stderr
    return r.stdout


def validate(path):
    return run(TOOLS / "kubernetes-validate", "--strict", path)


@pytest.mark.parametrize("overlay", ["local-target", "vllm-target", "local-target-saturation"])
def test_every_overlay_renders_and_every_object_validates(k8s, overlay, tmp_path):
    out = tmp_path / f"{overlay}.yaml"
    out.write_text(render(k8s, overlay))
    objs = [o for o in yaml.safe_load_all(out.read_text()) if o]
    kinds = {o["kind"] for o in objs}
    assert {"Namespace", "ServiceAccount", "Deployment", "Service", "ConfigMap", "Secret",
            "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy"} <= kinds, kinds
    r = validate(out)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed for resource") == len(objs), r.stdout


def test_schema_validation_does_fail_a_wrong_object(k8s, tmp_path):
    objs = [o for o in yaml.safe_load_all(render(k8s, "local-target")) if o]
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "approxy")
    dep["spec"]["template"]["spec"]["containers"][0]["readinessProb"] = {"httpGet": {"path": "/ready"}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(dep))
    r = validate(bad)
    assert r.returncode != 0 and "readinessProb" in r.stdout + r.stderr, r.stdout + r.stderr


def objects(k8s, overlay):
    objs = [o for o in yaml.safe_load_all(render(k8s, overlay)) if o]
    return {(o["kind"], o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] == "Secret" else o["metadata"]["name"]): o
            for o in objs}


def seconds(s):
    m = re.fullmatch(r"(\d+)s", s)
    assert m, s
    return int(m[1])


@pytest.mark.parametrize("overlay,policy_file", [("local-target", K8S / "base" / "policy.toml"),
                                                 ("vllm-target", K8S / "overlays" / "vllm-target" / "policy.toml")])
def test_the_manifests_agree_with_the_policy_they_mount(k8s, overlay, policy_file):
    o = objects(k8s, overlay)
    cm = o[("ConfigMap", "approxy-policy")]
    # The ConfigMap carries the file unchanged, under a fixed name, so edits reload in place.
    assert cm["data"]["approxy.toml"] == policy_file.read_text()
    policy = tomllib.loads(cm["data"]["approxy.toml"])
    pod = o[("Deployment", "approxy")]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {e["name"]: e for e in c["env"]}
    # The mount is a directory (a subPath mount never sees ConfigMap updates) holding the
    # file APPROXY_POLICY names.
    mount = next(m for m in c["volumeMounts"] if m["name"] == "policy")
    assert "subPath" not in mount and env["APPROXY_POLICY"]["value"] == mount["mountPath"] + "/approxy.toml"
    assert next(v for v in pod["volumes"] if v["name"] == "policy")["configMap"]["name"] == "approxy-policy"
    # The keys the policy names come from the (hash-named) Secret the overlay generates.
    secret = o[("Secret", "approxy-keys")]
    assert policy["gateway"]["api_keys_env"] == "APPROXY_API_KEYS"
    ref = env["APPROXY_API_KEYS"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["data"]
    assert env[policy["target"]["api_key_env"]]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    # Probes on the paths approxy serves, on the port it listens on.
    port = int(env["APPROXY_LISTEN"]["value"].rsplit(":", 1)[1])
    assert c["ports"][0]["containerPort"] == port
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready" and c["livenessProbe"]["httpGet"]["path"] == "/health"
    # The grace period covers the preStop pause and the longest request the policy allows.
    pause = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] >= pause + seconds(policy["gateway"]["request_timeout"])
    # One draft worker's threads are what the container asks for.
    assert int(c["resources"]["requests"]["cpu"]) == policy["draft"]["workers"] * policy["draft"]["threads_per_worker"]
    # Selectors pick approxy's pods and nothing else.
    pod_labels = o[("Deployment", "approxy")]["spec"]["template"]["metadata"]["labels"]
    for sel in (o[("Service", "approxy")]["spec"]["selector"],
                o[("PodDisruptionBudget", "approxy")]["spec"]["selector"]["matchLabels"],
                o[("NetworkPolicy", "approxy")]["spec"]["podSelector"]["matchLabels"]):
        assert sel and sel.items() <= pod_labels.items(), sel
    assert pod_labels["app.kubernetes.io/name"] == "approxy"
    # Egress goes to DNS and to the target's port only.
    egress = o[("NetworkPolicy", "approxy")]["spec"]["egress"]
    target_port = int(re.search(r":(\d+)", policy["target"]["base_url"].split("//", 1)[1])[1])
    assert sorted(p["port"] for rule in egress for p in rule["ports"]) == sorted([53, 53, target_port])


def test_the_saturation_component_scales_on_approxys_metric(k8s):
    hpa = objects(k8s, "local-target-saturation")[("HorizontalPodAutoscaler", "approxy")]
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == ["approxy_draft_saturation"]


POLICIES = [K8S / "base" / "policy.toml", K8S / "overlays" / "vllm-target" / "policy.toml",
            DEPLOY / "compose" / "llama-server" / "approxy.toml", DEPLOY / "compose" / "vllm" / "approxy.toml"]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_deployment_policy_passes_approxy_check(policy):
    r = run(BIN, "check", "--policy", policy, env={**os.environ, "APPROXY_API_KEYS": "k"})
    assert r.returncode == 0, r.stdout + r.stderr
    p = tomllib.loads(policy.read_text())
    # Deployed gateways listen beyond loopback: they must require client keys.
    assert p["gateway"].get("auth", "keys") == "keys" and p["gateway"]["api_keys_env"]


def test_the_compose_file_fits_its_images_and_files():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert services["approxy"]["profiles"] == ["cpu"] and services["approxy-gpu"]["profiles"] == ["gpu"]
    assert services["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    # The images build.sh --compose makes, at the workspace's version.
    version = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["package"]["version"]
    for name, image in [("approxy", "approxy"), ("llama-server", "approxy-llama-server"), ("prometheus", "approxy-prometheus")]:
        assert services[name]["image"] == f"localhost/{image}:{version}"
    # Every bind mount names a file or directory in the repository, and the policies the two
    # approxy services mount point at the services that run in the same profile.
    for svc in services.values():
        for v in svc.get("volumes", []):
            src = v.split(":", 1)[0]
            if src.startswith("./"):
                assert (DEPLOY / src).exists(), src
    for svc, target in [("approxy", "llama-server"), ("approxy-gpu", "vllm")]:
        src = services[svc]["volumes"][0].split(":", 1)[0]
        policy = tomllib.loads((DEPLOY / src / "approxy.toml").read_text())
        assert policy["target"]["base_url"].split("//", 1)[1].startswith(target + ":")
        assert target in services[svc]["depends_on"]
    # SIGTERM drains: compose waits at least as long as the longest request.
    policy = tomllib.loads((DEPLOY / "compose" / "llama-server" / "approxy.toml").read_text())
    assert seconds(services["approxy"]["stop_grace_period"]) >= seconds(policy["gateway"]["request_timeout"])


def test_the_compose_prometheus_configuration_passes_promtool(tmp_path):
    assert PROMTOOL, "APPROXY_PROMTOOL_BIN is not set: run ./deploy/test-all.sh"
    # The rule file sits where compose mounts it.
    conf = (DEPLOY / "compose" / "prometheus.yml").read_text()
    assert "/etc/prometheus/alerts.yml" in conf
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(conf.replace("/etc/prometheus/alerts.yml", str(tmp_path / "alerts.yml")))
    r = run(PROMTOOL, "check", "config", tmp_path / "prometheus.yml")
    assert r.returncode == 0, r.stdout + r.stderr
