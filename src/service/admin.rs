//! The admin HTTP listener, a face beside gRPC on the same call path (it calls the `Decider`,
//! never the other way round):
//! - `/healthz`: the process answers (liveness; never depends on a store),
//! - `/healthcheck`: envoyproxy/ratelimit's health path: `OK`, or 500 while draining,
//! - `/readyz`: not draining; the store's state and the rules are reported in the body; fails
//!   while the store refuses us for good (wrong password, permissions, certificate) unless
//!   `--ready-on-permanent-store-errors`, while it is merely down only with
//!   `--ready-requires-store`, while no domain is loaded only with `--ready-requires-rules`,
//! - `/rlconfig`: the rules in force, one line per limit,
//! - `/metrics`: Prometheus (OpenMetrics text),
//! - `/json` (only with `--admin-json`: it spends budget): POST a proto3-JSON RateLimitRequest,
//!   get the JSON response (200 OK, 429 over the limit, 400 bad input, 503 store unavailable).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::scaling::ScalingHandle;
use super::{Decider, json};
use crate::limiter::Limiter;
use crate::rules::Snapshot;
use crate::rules::scaling::{Scope, check_factor};
use crate::telemetry::Metrics;

#[derive(Clone)]
pub struct AdminState {
    pub rules: Arc<ArcSwap<Snapshot>>,
    pub limiter: Arc<Limiter>,
    pub decider: Arc<Decider>,
    pub metrics: Arc<Metrics>,
    pub draining: Arc<AtomicBool>,
    pub ready_requires_store: bool,
    pub ready_requires_rules: bool,
    /// Stay ready while the store refuses us permanently (wrong password, ...).
    pub ready_on_permanent_store_errors: bool,
    /// How long the readiness ping of the store may take.
    pub store_ping_timeout: std::time::Duration,
    /// Whether the store has answered once since start.
    pub store_answered: Arc<AtomicBool>,
    /// Not ready until the store has answered once (it could answer only by its failure mode),
    /// as the Go service is not before its first Redis connection.
    pub ready_requires_first_store_answer: bool,
    /// Runtime scaling in force, and what reads it back from the store.
    pub scaling: Arc<ScalingHandle>,
    /// The file of the bearer token `POST /scaling` requires; none: no token (loopback only).
    pub scaling_token_file: Option<std::path::PathBuf>,
    /// A statsd_exporter mapping for the Go-named series (else the Go service's default one).
    pub go_mapping: Option<Arc<crate::telemetry::statsd_mapping::StatsdMapping>>,
    /// What the quota service (RLQS) has assigned, when it runs, and what RLS sees held:
    /// `GET /rlqs`.
    pub quota: Option<Arc<super::quota::Registry>>,
}

/// Which endpoints one HTTP listener serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    /// `/healthz`, `/readyz`, `/healthcheck`.
    pub health: bool,
    /// `/rlconfig` (shows every rule).
    pub rules: bool,
    /// `/metrics`, Portcullis' names.
    pub metrics: bool,
    /// `POST /json` (it spends budget like a gateway's call).
    pub json: bool,
    /// envoyproxy/ratelimit's metric names, at this path.
    pub go_metrics: Option<String>,
    /// `GET /scaling`, and `POST /scaling` to set a temporary factor (off unless asked for).
    pub scaling: bool,
}

impl Routes {
    /// The admin listener: everything of ours, `/json` only when asked for.
    pub fn admin(json: bool, scaling: bool) -> Routes {
        Routes {
            health: true,
            rules: true,
            metrics: true,
            json,
            go_metrics: None,
            scaling,
        }
    }
}

pub fn router(state: AdminState, routes: &Routes) -> Router {
    let mut router = Router::new();
    if routes.health {
        router = router
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/healthcheck", get(healthcheck))
            .route("/readyz", get(readyz));
    }
    if routes.rules {
        router = router.route("/rlconfig", get(rlconfig));
        if let Some(quota) = state.quota.clone() {
            router = router.route(
                "/rlqs",
                get(move || async move {
                    (
                        [(http::header::CONTENT_TYPE, "application/json")],
                        quota.json(),
                    )
                }),
            );
        }
    }
    if routes.metrics {
        router = router
            .route("/metrics", get(metrics))
            .route("/stats", get(go_stats));
    }
    if routes.json {
        router = router.route("/json", post(json_call));
    }
    if routes.scaling {
        router = router.route("/scaling", get(scaling_get).post(scaling_set));
    }
    if let Some(path) = &routes.go_metrics {
        router = router.route(path, get(go_metrics));
    }
    router.with_state(state)
}

/// envoyproxy/ratelimit's HTTP health path: `OK` while serving, 500 once draining (as Go answers).
/// The Go service's health endpoint: `OK`, or 500 whenever this replica is not ready (draining,
/// no rules with --ready-requires-rules, a store that refuses us), as its probes expect.
async fn healthcheck(State(state): State<AdminState>) -> (StatusCode, String) {
    match readiness(&state).await {
        (true, _) => (StatusCode::OK, "OK".into()),
        (false, body) => (StatusCode::INTERNAL_SERVER_ERROR, body),
    }
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, String) {
    let (ready, body) = readiness(&state).await;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, body)
}

/// Whether this replica should receive calls, and why (the body of `/readyz`). The gRPC health
/// of the service follows the same answer (see `server`).
pub async fn readiness(state: &AdminState) -> (bool, String) {
    let rules = state.rules.load();
    let loaded_secs = rules
        .loaded_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut body = format!(
        "rules: {} rule(s) from {} file(s), loaded at {loaded_secs} (unix)\n",
        rules.rules().len(),
        rules.files.len()
    );
    let store = state.limiter.store_ready(state.store_ping_timeout).await;
    let store_name = state.limiter.store_name();
    match &store {
        Ok(()) => body.push_str(&format!("store: {store_name} ok\n")),
        Err(e) => body.push_str(&format!("store: {store_name} failing: {e}\n")),
    }
    if store.is_ok() {
        state.store_answered.store(true, Ordering::Relaxed);
    }
    if state.draining.load(Ordering::Relaxed) {
        body.push_str("draining: shutting down\n");
        return (false, body);
    }
    if state.ready_requires_first_store_answer && !state.store_answered.load(Ordering::Relaxed) {
        body.push_str(
            "not ready: the store has not answered since start; a replica takes calls once it \
             can decide them\n",
        );
        return (false, body);
    }
    let no_domain = rules.domain_names().is_empty();
    if no_domain {
        body.push_str("rules: no domain loaded\n");
    }
    if state.ready_requires_rules && no_domain {
        return (false, body);
    }
    if let Err(e) = &store
        && e.is_permanent()
        && !state.ready_on_permanent_store_errors
    {
        body.push_str("not ready: the store refuses us; fix its configuration (or start with --ready-on-permanent-store-errors)\n");
        return (false, body);
    }
    if state.ready_requires_store && store.is_err() {
        return (false, body);
    }
    (true, body)
}

async fn rlconfig(State(state): State<AdminState>) -> String {
    let rules = state.rules.load();
    let mut out = String::new();
    for rule in rules.rules() {
        out.push_str(&rule.describe());
        out.push('\n');
    }
    for line in state.scaling.scaling.load().describe() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

async fn scaling_get(State(state): State<AdminState>) -> String {
    let lines = state.scaling.scaling.load().describe();
    if lines.is_empty() {
        return "scaling: none (every limit as configured)\n".into();
    }
    lines.join("\n") + "\n"
}

/// The body of `POST /scaling`: `{"scope": "domain", "name": "edge", "factor": 0.5,
/// "for_seconds": 1800}`; `for_seconds` 0 removes the factor.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ScalingChange {
    scope: String,
    name: Option<String>,
    factor: Option<f64>,
    for_seconds: u64,
}

/// The longest a temporary factor may be set for: an incident's, not a policy's (that is the
/// scaling file's job).
const MAX_SCALING_SECONDS: u64 = 7 * 24 * 3600;

/// The refusal, unless the call carries the bearer token of `file` (read now: a rotated Secret
/// applies).
fn unauthorized(file: &std::path::Path, headers: &axum::http::HeaderMap) -> Option<Response> {
    let token = match std::fs::read_to_string(file) {
        Ok(text) if !text.trim().is_empty() => text.trim().to_owned(),
        Ok(_) | Err(_) => {
            tracing::warn!(file = %file.display(), "the scaling token file is missing or empty: POST /scaling refused");
            return Some(json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the scaling token cannot be read; no change is accepted",
            ));
        }
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    // Compared in time independent of where they differ.
    let same = given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        return None;
    }
    static REFUSED: std::sync::LazyLock<crate::telemetry::LogThrottle> =
        std::sync::LazyLock::new(Default::default);
    if let Some(skipped) = REFUSED.allow() {
        tracing::warn!(
            similar_not_logged = skipped,
            "POST /scaling without the right bearer token refused"
        );
    }
    Some(
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "a scaling change needs Authorization: Bearer <token>\n",
        )
            .into_response(),
    )
}

async fn scaling_set(
    State(state): State<AdminState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(file) = &state.scaling_token_file
        && let Some(refused) = unauthorized(file, &headers)
    {
        return refused;
    }
    let change: ScalingChange = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                &format!("not a scaling change: {e}"),
            );
        }
    };
    let scope = match Scope::parse(&change.scope, change.name.as_deref()) {
        Ok(s) => s,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
    };
    if change.for_seconds > MAX_SCALING_SECONDS {
        return json_error(
            StatusCode::BAD_REQUEST,
            &format!("for_seconds is at most {MAX_SCALING_SECONDS} (a week)"),
        );
    }
    let factor = match (change.for_seconds, change.factor) {
        (0, _) => 1.0,
        (_, Some(f)) => match check_factor(f) {
            Ok(f) => f,
            Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
        },
        (_, None) => return json_error(StatusCode::BAD_REQUEST, "factor is required"),
    };
    let within = state
        .store_ping_timeout
        .max(std::time::Duration::from_secs(1));
    let saved = state
        .limiter
        .save_factor(&scope.field(), factor, change.for_seconds * 1000, within)
        .await;
    if let Err(e) = saved {
        tracing::warn!(error = %e, %scope, "scaling change not saved");
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the store did not keep the change: {e}"),
        );
    }
    let _ = super::scaling::refresh(
        &state.limiter,
        &state.scaling.scaling,
        &state.rules,
        &state.metrics,
        &state.scaling.last,
        within,
    )
    .await;
    if change.for_seconds == 0 {
        tracing::warn!(%scope, "temporary scaling removed");
    } else {
        tracing::warn!(%scope, factor, for_seconds = change.for_seconds, "temporary scaling set");
    }
    (StatusCode::OK, scaling_get(State(state)).await).into_response()
}

async fn metrics(State(state): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

/// The Go service's debug `/stats`: its stat names and their values, one `name: value` a line.
async fn go_stats(State(state): State<AdminState>) -> String {
    let mut out = String::new();
    for (name, value) in crate::telemetry::go_names::statsd_counters(&state.metrics) {
        out.push_str(&format!("{name}: {value}\n"));
    }
    out
}

/// envoyproxy/ratelimit's names, as its Prometheus sink serves them (text format 0.0.4).
async fn go_metrics(State(state): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        match &state.go_mapping {
            None => crate::telemetry::go_names::prometheus_text(&state.metrics),
            Some(mapping) => crate::telemetry::statsd_mapping::exposition(
                mapping,
                &crate::telemetry::go_names::statsd_counters(&state.metrics),
                &crate::telemetry::go_names::statsd_timers(&state.metrics),
            ),
        },
    )
        .into_response()
}

async fn json_call(State(state): State<AdminState>, body: axum::body::Bytes) -> Response {
    let request = match json::request_from_json(&body) {
        Ok(r) => r,
        Err(message) => return json_error(StatusCode::BAD_REQUEST, &message),
    };
    match state.decider.decide(&request).await {
        Ok(response) => {
            let status = if response.overall_code
                == crate::pb::rate_limit_response::Code::OverLimit as i32
            {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                json::response_to_json(&response),
            )
                .into_response()
        }
        Err(status) if status.code() == tonic::Code::InvalidArgument => {
            json_error(StatusCode::BAD_REQUEST, status.message())
        }
        Err(status) => json_error(StatusCode::SERVICE_UNAVAILABLE, status.message()),
    }
}

fn json_error(code: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
