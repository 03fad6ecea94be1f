//! The deployment files agree with the service and with each other: the dashboard and alerts name
//! only metrics Portcullis exports; every rules file passes `check`; each gateway configuration
//! (Envoy, Istio) sends descriptors its rules have limits for, to a cluster that exists; the
//! rendered Kubernetes manifests carry the probes, limits, drain and security settings the README
//! promises. (Schemas and lint: `scripts/validate-deploy`, run by `scripts/test`.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use portcullis::rules::{LoadOptions, load_dir};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .expect("YAML parses")
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

fn yaml_file(path: &str) -> Vec<Value> {
    yaml_documents(&std::fs::read_to_string(repo(path)).expect("read YAML"))
}

/// Every `portcullis_*` name in a query.
fn metric_names(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("portcullis_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

/// docs/operating.md's table has a row for every metric Portcullis exports (a histogram by its
/// own name: `_bucket`, `_sum` and `_count` are Prometheus'). `portcullis_memory_store_fill_ratio`
/// was missing.
#[test]
fn the_metrics_table_lists_every_metric_portcullis_exports() {
    let metrics = portcullis::telemetry::Metrics::default();
    let table = std::fs::read_to_string(repo("docs/operating.md")).unwrap();
    let missing: Vec<String> = metrics
        .exported_names()
        .iter()
        .map(|n| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
                .to_owned()
        })
        .filter(|n| !table.contains(&format!("`{n}`")))
        .collect();
    assert!(missing.is_empty(), "not in docs/operating.md: {missing:?}");
}

#[test]
fn the_dashboard_and_the_alerts_name_only_metrics_portcullis_exports() {
    let metrics = portcullis::telemetry::Metrics::default();
    let exported: BTreeSet<&str> = metrics
        .exported_names()
        .iter()
        .map(String::as_str)
        .collect();
    assert!(
        exported.contains("portcullis_rule_hits_total"),
        "{exported:?}"
    );

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo("deploy/grafana/portcullis.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            queries.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    assert!(
        queries.len() >= 10,
        "a dashboard of {} queries",
        queries.len()
    );
    for doc in yaml_file("deploy/prometheus/alerts.yaml") {
        for group in doc["groups"].as_array().expect("groups") {
            for rule in group["rules"].as_array().expect("rules") {
                queries.push(rule["expr"].as_str().expect("expr").to_owned());
            }
        }
    }
    let mut unknown = Vec::new();
    for query in &queries {
        let names = metric_names(query);
        assert!(
            !names.is_empty(),
            "a query on no Portcullis metric: {query}"
        );
        unknown.extend(names.into_iter().filter(|n| !exported.contains(n.as_str())));
    }
    assert!(
        unknown.is_empty(),
        "queries on metrics Portcullis does not export: {unknown:?}"
    );
}

#[test]
fn every_rules_file_of_the_repository_passes_check() {
    for dir in [
        "examples/rules",
        "deploy/kubernetes/base/rules",
        "deploy/istio/rules/rules",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_portcullis"))
            .args(["check"])
            .arg(repo(dir))
            .output()
            .expect("run portcullis check");
        assert!(
            out.status.success(),
            "{dir}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Finds every object that has `key` (anywhere below `value`).
fn find_all<'a>(value: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
    match value {
        Value::Object(map) => {
            if let Some(found) = map.get(key) {
                out.push(found);
            }
            for v in map.values() {
                find_all(v, key, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| find_all(v, key, out)),
        _ => {}
    }
}

/// The descriptor key sequences a gateway's `rate_limits` produce.
fn descriptor_key_paths(config: &Value) -> Vec<Vec<String>> {
    let mut lists = Vec::new();
    find_all(config, "rate_limits", &mut lists);
    let mut paths = Vec::new();
    for list in lists {
        for limit in list.as_array().expect("rate_limits is a list") {
            let keys = limit["actions"]
                .as_array()
                .expect("actions")
                .iter()
                .map(|action| {
                    if action.get("remote_address").is_some() {
                        "remote_address".to_owned()
                    } else if let Some(h) = action.get("request_headers") {
                        h["descriptor_key"].as_str().expect("descriptor_key").into()
                    } else if let Some(g) = action.get("generic_key") {
                        g["descriptor_key"].as_str().unwrap_or("generic_key").into()
                    } else if let Some(m) = action.get("header_value_match") {
                        m["descriptor_key"]
                            .as_str()
                            .unwrap_or("header_match")
                            .into()
                    } else {
                        panic!("an action this test does not know: {action}")
                    }
                })
                .collect();
            paths.push(keys);
        }
    }
    paths
}

/// (domain, cluster) of every rate limit filter in `config`.
fn rate_limit_filters(config: &Value) -> Vec<(String, String)> {
    let mut configs = Vec::new();
    find_all(config, "typed_config", &mut configs);
    configs
        .into_iter()
        .filter(|c| {
            c["@type"].as_str()
                == Some("type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit")
        })
        .map(|c| {
            (
                c["domain"].as_str().expect("domain").to_owned(),
                c["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
                    .as_str()
                    .expect("cluster_name")
                    .to_owned(),
            )
        })
        .collect()
}

fn assert_rules_cover(rules_dir: &str, domain: &str, paths: &[Vec<String>], what: &str) {
    let snapshot = load_dir(&repo(rules_dir), LoadOptions::default()).expect("rules load");
    let limited = snapshot.rule_key_paths(domain);
    assert!(!limited.is_empty(), "{rules_dir} has no domain {domain:?}");
    for path in paths {
        assert!(
            limited.contains(path),
            "{what} sends descriptors {path:?} in domain {domain:?}, which {rules_dir} has no \
             rule for (rules at {limited:?})"
        );
    }
}

#[test]
fn the_envoy_example_sends_what_its_rules_limit_to_a_cluster_it_defines() {
    let envoy = &yaml_file("deploy/envoy/envoy.yaml")[0];
    let filters = rate_limit_filters(envoy);
    assert_eq!(filters.len(), 1);
    let (domain, cluster) = &filters[0];
    let clusters: Vec<&str> = envoy["static_resources"]["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(
        clusters.contains(&cluster.as_str()),
        "{cluster} is not a cluster"
    );
    let paths = descriptor_key_paths(envoy);
    assert_eq!(paths.len(), 5, "{paths:?}");
    assert_rules_cover(
        "deploy/kubernetes/base/rules",
        domain,
        &paths,
        "deploy/envoy",
    );
    // The sidecar overlay runs exactly this file.
    assert_eq!(
        std::fs::read(repo("deploy/envoy/envoy.yaml")).unwrap(),
        std::fs::read(repo("deploy/kubernetes/overlays/sidecar/envoy.yaml")).unwrap(),
        "deploy/kubernetes/overlays/sidecar/envoy.yaml must be a copy of deploy/envoy/envoy.yaml"
    );
}

#[test]
fn the_istio_filters_send_what_the_task_rules_limit_to_portcullis() {
    for layout in ["shared", "sidecar"] {
        let docs = yaml_file(&format!("deploy/istio/{layout}/filter.yaml"));
        let all = Value::Array(docs.clone());
        let filters = rate_limit_filters(&all);
        assert_eq!(filters.len(), 1, "{layout}");
        let (domain, cluster) = &filters[0];
        let paths = descriptor_key_paths(&all);
        assert!(!paths.is_empty());
        assert_rules_cover("deploy/istio/rules/rules", domain, &paths, layout);
        match layout {
            // The Service of the shared layout, in the namespace the kustomization puts it in.
            "shared" => {
                assert_eq!(
                    cluster,
                    "outbound|8081||portcullis.istio-system.svc.cluster.local"
                );
                let kustomization = &yaml_file("deploy/istio/shared/kustomization.yaml")[0];
                assert_eq!(kustomization["namespace"], "istio-system");
                let service = &yaml_file("deploy/kubernetes/overlays/shared/service.yaml")[0];
                assert_eq!(service["metadata"]["name"], "portcullis");
                assert_eq!(service["spec"]["ports"][0]["port"], 8081);
            }
            // The cluster the same file adds, on loopback.
            _ => {
                let mut clusters = Vec::new();
                find_all(&all, "load_assignment", &mut clusters);
                assert!(
                    clusters
                        .iter()
                        .any(|c| c["cluster_name"].as_str() == Some(cluster.as_str())),
                    "{cluster} is not added"
                );
            }
        }
    }
}

/// `kubectl kustomize <dir>`: the rendered documents.
fn render(dir: &str) -> Vec<Value> {
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(repo(dir))
        .output()
        .expect(
            "kubectl is needed to render the manifests (it carries kustomize): install it from \
             your distribution or https://kubernetes.io/docs/tasks/tools/",
        );
    assert!(
        out.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_documents(&String::from_utf8(out.stdout).unwrap())
}

/// The Portcullis containers of the rendered manifests, with their pod specs.
fn portcullis_containers(docs: &[Value]) -> Vec<(&Value, &Value)> {
    let mut found = Vec::new();
    for doc in docs {
        let Some(pod) = doc["spec"]["template"]["spec"].as_object() else {
            continue;
        };
        let pod_value = &doc["spec"]["template"]["spec"];
        for list in ["containers", "initContainers"] {
            for c in pod
                .get(list)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if c["name"] == "portcullis" {
                    found.push((pod_value, c));
                }
            }
        }
    }
    found
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

#[test]
fn every_layout_renders_with_the_probes_drain_limits_and_security_it_promises() {
    for dir in [
        "deploy/kubernetes/overlays/shared",
        "deploy/kubernetes/overlays/sidecar",
        "deploy/istio/shared",
        "deploy/istio/sidecar",
    ] {
        let docs = render(dir);
        let containers = portcullis_containers(&docs);
        assert_eq!(containers.len(), 1, "{dir}: one Portcullis container");
        let (pod, c) = containers[0];
        // Liveness never depends on Redis or a drain; readiness follows /readyz.
        assert_eq!(
            c["livenessProbe"]["grpc"]["service"], "portcullis.liveness",
            "{dir}"
        );
        assert_eq!(c["readinessProbe"]["grpc"]["service"], "ratelimit", "{dir}");
        assert_eq!(c["livenessProbe"]["grpc"]["port"], 8081, "{dir}");
        // The drain fits in the grace period.
        let drain: u64 = env(c, "PORTCULLIS_DRAIN_PERIOD")
            .and_then(|d| d.strip_suffix('s'))
            .and_then(|d| d.parse().ok())
            .expect("a drain period in seconds");
        let grace = pod["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("grace");
        assert!(
            grace >= drain + 5,
            "{dir}: grace {grace}s for a {drain}s drain"
        );
        // Restricted security.
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{dir}");
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{dir}"
        );
        let security = &c["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{dir}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{dir}");
        assert_eq!(security["capabilities"]["drop"][0], "ALL", "{dir}");
        for kind in ["requests", "limits"] {
            assert!(
                c["resources"][kind]["memory"].is_string()
                    && c["resources"][kind]["cpu"].is_string(),
                "{dir}: {kind}"
            );
        }
        // Rules: the ConfigMap as a directory (no subPath: a subPath mount never sees updates).
        let mount = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/etc/portcullis/rules")
            .expect("rules mounted");
        assert!(mount.get("subPath").is_none(), "{dir}");
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .expect("rules volume");
        assert_eq!(volume["configMap"]["name"], "portcullis-rules", "{dir}");
        // The Redis password comes from a Secret, never a literal.
        let password = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "PORTCULLIS_REDIS_PASSWORD")
            .expect("a Redis password");
        assert!(password["valueFrom"]["secretKeyRef"].is_object(), "{dir}");
        // Sidecar layouts: a native sidecar.
        if dir.ends_with("sidecar") {
            assert_eq!(c["restartPolicy"], "Always", "{dir}: a native sidecar");
            assert!(c["startupProbe"].is_object(), "{dir}");
        }
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        assert!(kinds.contains(&"ServiceMonitor"), "{dir}: {kinds:?}");
        // The rules ConfigMap keeps its name: updates reach the pods without a rollout.
        assert!(
            docs.iter()
                .any(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "portcullis-rules"),
            "{dir}"
        );
    }
    // Shared: the Service speaks HTTP/2, a disruption budget, an autoscaler, spread, rollout.
    let docs = render("deploy/kubernetes/overlays/shared");
    let of_kind = |kind: &'static str| docs.iter().filter(move |d| d["kind"] == kind);
    let grpc = of_kind("Service")
        .find(|s| s["metadata"]["name"] == "portcullis")
        .expect("the Service");
    assert_eq!(grpc["spec"]["ports"][0]["name"], "grpc");
    assert_eq!(grpc["spec"]["ports"][0]["appProtocol"], "kubernetes.io/h2c");
    assert_eq!(of_kind("PodDisruptionBudget").count(), 1);
    assert_eq!(of_kind("HorizontalPodAutoscaler").count(), 1);
    let deployment = of_kind("Deployment").next().expect("the Deployment");
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    assert!(
        deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    );
    // The try-it Redis keeps its counters across a restart.
    let redis = of_kind("StatefulSet").next().expect("Redis");
    let args = redis["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(
        args.contains("appendfsync") && args.contains("everysec"),
        "{args}"
    );
}

#[test]
fn every_portcullis_variable_the_guides_name_exists() {
    // Every command's variables (`serve`'s, and `ask`'s PORTCULLIS_ASK_ADDR).
    let help: String = ["serve", "check", "explain", "test", "diff", "ask"]
        .iter()
        .map(|command| {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
                .args([command, "--help"])
                .output()
                .expect("portcullis COMMAND --help");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect();
    let mut guides: Vec<String> = ["deploy/envoy-gateway.md", "deploy/README.md", "README.md"]
        .map(String::from)
        .to_vec();
    for page in std::fs::read_dir(repo("docs")).unwrap() {
        let path = page.unwrap().path();
        guides.push(format!(
            "docs/{}",
            path.file_name().unwrap().to_string_lossy()
        ));
    }
    for guide in &guides {
        let text = std::fs::read_to_string(repo(guide)).unwrap();
        for (at, _) in text.match_indices("PORTCULLIS_") {
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            // A family written with `*` (`PORTCULLIS_*`, `PORTCULLIS_HEADER_*_NAME`), or one
            // docs/configuration.md names as not Portcullis' (a misspelling refused, Kubernetes'
            // service links left alone).
            if name.ends_with('_')
                || (guide == "docs/configuration.md"
                    && [
                        "PORTCULLIS_STOR",
                        "PORTCULLIS_SERVICE_HOST",
                        "PORTCULLIS_PORT",
                        "PORTCULLIS_METRICS_PORT_9090_TCP_ADDR",
                    ]
                    .contains(&name.as_str()))
            {
                continue;
            }
            assert!(
                // `[env: NAME=]`, or `[env: NAME]` for a secret's.
                help.contains(&format!("[env: {name}="))
                    || help.contains(&format!("[env: {name}]")),
                "{guide} names {name}, which no command reads"
            );
        }
    }
}

/// One version everywhere: Cargo's (what `--version` prints), the image's label, and a section of
/// CHANGELOG.md (how a version is cut is said there).
#[test]
fn the_binary_the_image_and_the_changelog_agree_on_the_version() {
    let version = env!("CARGO_PKG_VERSION");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portcullis"))
        .arg("--version")
        .output()
        .expect("portcullis --version");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("portcullis {version}")
    );
    let dockerfile = std::fs::read_to_string(repo("deploy/Dockerfile")).unwrap();
    assert!(
        dockerfile.contains(&format!("ARG VERSION={version}\n")),
        "deploy/Dockerfile's VERSION is not {version}"
    );
    assert!(dockerfile.contains("org.opencontainers.image.version=\"${VERSION}\""));
    let changelog = std::fs::read_to_string(repo("CHANGELOG.md")).unwrap();
    assert!(
        changelog.contains(&format!("\n## {version} (")),
        "CHANGELOG.md has no section for {version}"
    );
}
