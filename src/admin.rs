//! The admin HTTP listener: `/healthz` (the process answers; never depends on a store),
//! `/readyz` (rules are loaded) and `/rlconfig` (the loaded rules, one line per limit).

use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::State;
use axum::routing::get;

use crate::rules::Snapshot;

#[derive(Clone)]
pub struct AdminState {
    pub rules: Arc<ArcSwap<Snapshot>>,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|| async { "ready\n" }))
        .route("/rlconfig", get(rlconfig))
        .with_state(state)
}

async fn rlconfig(State(state): State<AdminState>) -> String {
    let rules = state.rules.load();
    let mut out = String::new();
    for rule in rules.rules() {
        out.push_str(&rule.describe());
        out.push('\n');
    }
    out
}
