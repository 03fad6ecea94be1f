//! The tests that start real `redis-server` processes (standalone, Sentinel, a 3-master Cluster)
//! on free loopback ports: the Lua scripts against the memory model, connections, outages, the
//! Go drop-in mode's stores, RLQS on Redis, the bounds. One binary, a module per journey
//! (docs/testing.md says how the suite is grouped and how to run one group).

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod batching;
mod bounds;
mod cluster_nodes;
mod connections;
mod deny_cache;
mod errors;
mod failover;
mod failover_promoted;
mod go_compat;
mod hot;
mod hot_drain;
mod late_charges;
mod layered;
mod one_budget;
mod outage;
mod parity;
mod per_second;
mod replicas;
mod rlqs;
mod rlqs_churn;
mod rlqs_counting;
mod rlqs_model;
mod rlqs_one_step;
mod scaling;
mod scripts;
mod secrets;
mod traps;
mod zero_limit;
