//! The Cluster's node map: which master serves each slot, read with `CLUSTER SLOTS` at start,
//! every `MAP_REFRESH` and when a batch found it stale, and the slot of a key (its hash tag's
//! CRC16). The batcher groups calls per master by it; a stale map costs a split batch, never a
//! wrong decision. It must never route a call itself.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use redis::cluster_async::ClusterConnection;
use tokio::sync::{Notify, watch};

/// Slots in a Cluster.
const SLOTS: usize = 16384;
/// How often the node map is read again when nothing asked for it.
const MAP_REFRESH: Duration = Duration::from_secs(30);
/// The least time between two readings (a split batch asks for one).
const MAP_SPACING: Duration = Duration::from_secs(1);
/// Most masters the map tells apart; beyond, their slots batch per slot.
const MAX_NODES: usize = 1024;
/// Marks a slot whose master the map does not know.
const UNKNOWN: u16 = u16::MAX;

/// Which master serves each slot, as the last `CLUSTER SLOTS` said. A stale map costs a split
/// batch, never a wrong decision: the script checks every key is its node's before it starts.
pub struct NodeMap {
    node_of: Vec<u16>,
}

impl NodeMap {
    /// The lane of a slot: its master's when known, else its own.
    pub(super) fn lane(&self, slot: u16) -> u32 {
        match self.node_of.get(usize::from(slot)) {
            Some(&node) if node != UNKNOWN => SLOTS as u32 + u32::from(node),
            _ => u32::from(slot),
        }
    }
}

/// Reads the node map at start, every `MAP_REFRESH`, and when a batch found it stale (at most
/// once per `MAP_SPACING`); stops with the dispatcher. While the map cannot be read, calls
/// batch per slot (`None`).
pub(super) async fn keep_node_map(
    mut conn: ClusterConnection,
    maps: watch::Sender<Option<Arc<NodeMap>>>,
    stale: Arc<Notify>,
) {
    // Node addresses seen so far: a node keeps its number across readings, so a lane keeps its
    // node while the map changes.
    let mut nodes: Vec<String> = Vec::new();
    let mut by_node = false;
    loop {
        let read = tokio::time::timeout(MAP_REFRESH, read_node_map(&mut conn, &mut nodes)).await;
        let map = match read {
            Ok(Ok(map)) => Some(map),
            Ok(Err(reason)) => {
                tracing::debug!(%reason, "Cluster node map not read: batching per slot");
                None
            }
            Err(_) => None,
        };
        if map.is_some() != by_node {
            by_node = map.is_some();
            tracing::info!(
                by_node,
                "Cluster batching: {}",
                if by_node {
                    "per node"
                } else {
                    "per slot (the node map cannot be read)"
                }
            );
        }
        maps.send_replace(map.map(Arc::new));
        tokio::select! {
            () = maps.closed() => return,
            () = stale.notified() => {}
            () = tokio::time::sleep(MAP_REFRESH) => {}
        }
        tokio::select! {
            () = maps.closed() => return,
            () = tokio::time::sleep(MAP_SPACING) => {}
        }
    }
}

/// `CLUSTER SLOTS` on any node: the master of each slot.
async fn read_node_map(
    conn: &mut ClusterConnection,
    nodes: &mut Vec<String>,
) -> Result<NodeMap, String> {
    let slots: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    parse_cluster_slots(&slots, nodes)
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id…], replicas…]…]` into a master per slot.
fn parse_cluster_slots(reply: &Value, nodes: &mut Vec<String>) -> Result<NodeMap, String> {
    let Value::Array(ranges) = reply else {
        return Err(format!("CLUSTER SLOTS answered {reply:?}"));
    };
    let mut node_of = vec![UNKNOWN; SLOTS];
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(format!("a CLUSTER SLOTS range is {range:?}"));
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(format!("a CLUSTER SLOTS range is {parts:?}"));
        };
        let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1)) else {
            return Err(format!("a CLUSTER SLOTS master is {master:?}"));
        };
        let host: String = redis::from_redis_value(host.clone()).map_err(|e| e.to_string())?;
        let address = format!("{host}:{port}");
        let node = match nodes.iter().position(|n| *n == address) {
            Some(i) => i,
            None if nodes.len() < MAX_NODES => {
                nodes.push(address);
                nodes.len() - 1
            }
            None => continue,
        };
        let (start, end) = (usize::try_from(*start), usize::try_from(*end));
        let (Ok(start), Ok(end)) = (start, end) else {
            return Err("a negative slot in CLUSTER SLOTS".into());
        };
        for slot in node_of
            .iter_mut()
            .take(end.saturating_add(1).min(SLOTS))
            .skip(start)
        {
            *slot = node as u16;
        }
    }
    Ok(NodeMap { node_of })
}

/// Redis Cluster's slot of a key: CRC16 (XMODEM) of its hash tag (or of the whole key when it
/// has none), modulo 16384.
pub fn slot_of(key: &str) -> u16 {
    let hashed = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16::State::<crc16::XMODEM>::calculate(hashed.as_bytes()) % 16384
}
