//! An RLQS gateway as the tests play it: one stream, reports sent one at a time and each answer
//! awaited (bounded), and the assignments said in words.

use std::collections::HashMap;
use std::time::Duration;

use portcullis::pb::rlqs::{
    BlanketRule, BucketAction, BucketId, BucketQuotaUsage, RateLimitQuotaResponse,
    RateLimitQuotaServiceClient, RateLimitQuotaUsageReports, Strategy, bucket_action,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use super::TestServer;

/// A bucket id's entries, and the requests a gateway admitted and refused in it.
pub type Usage<'a> = (&'a [(&'a str, &'a str)], u64, u64);

/// One gateway's stream.
pub struct Gateway {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

impl Gateway {
    pub async fn open(server: &TestServer) -> Gateway {
        Self::open_at(server.running.as_ref().unwrap().grpc_addr).await
    }

    pub async fn open_at(addr: std::net::SocketAddr) -> Gateway {
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self::over(channel).await
    }

    /// A stream from address `ip` (a loopback one: a gateway on another host, as the server
    /// tells clients apart by address).
    pub async fn open_from(server: &TestServer, ip: std::net::IpAddr) -> Gateway {
        let addr = server.running.as_ref().unwrap().grpc_addr;
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .local_address(Some(ip))
            .connect()
            .await
            .unwrap();
        Self::over(channel).await
    }

    /// A stream over `channel` (TLS, say).
    pub async fn over(channel: tonic::transport::Channel) -> Gateway {
        Self::named_over(channel, None).await
    }

    /// A stream of a gateway that names itself (`x-portcullis-gateway-id`).
    pub async fn open_named(server: &TestServer, name: &str) -> Gateway {
        let addr = server.running.as_ref().unwrap().grpc_addr;
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self::named_over(channel, Some(name)).await
    }

    async fn named_over(channel: tonic::transport::Channel, name: Option<&str>) -> Gateway {
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (tx, outbound) = mpsc::channel(8);
        let mut request = tonic::Request::new(ReceiverStream::new(outbound));
        if let Some(name) = name {
            request
                .metadata_mut()
                .insert("x-portcullis-gateway-id", name.parse().unwrap());
        }
        let rx = client
            .stream_rate_limit_quotas(request)
            .await
            .expect("stream opens")
            .into_inner();
        Gateway { tx, rx }
    }

    /// Sends one report and waits (bounded: 5 s) for the answer.
    pub async fn report(
        &mut self,
        domain: &str,
        usages: &[Usage<'_>],
    ) -> Result<Vec<BucketAction>, tonic::Status> {
        self.report_within(domain, usages, Duration::from_secs(5))
            .await
    }

    /// `report`, waiting up to `within` for the answer (a test whose server may take longer).
    pub async fn report_within(
        &mut self,
        domain: &str,
        usages: &[Usage<'_>],
        within: Duration,
    ) -> Result<Vec<BucketAction>, tonic::Status> {
        let report = RateLimitQuotaUsageReports {
            domain: domain.into(),
            bucket_quota_usages: usages
                .iter()
                .map(|(id, allowed, denied)| BucketQuotaUsage {
                    bucket_id: Some(bucket(id)),
                    time_elapsed: Some(prost_types::Duration {
                        seconds: 1,
                        nanos: 0,
                    }),
                    num_requests_allowed: *allowed,
                    num_requests_denied: *denied,
                })
                .collect(),
        };
        self.send_within(report, within).await
    }

    /// Sends `report` as it is and waits (bounded: 5 s) for the answer.
    pub async fn send(
        &mut self,
        report: RateLimitQuotaUsageReports,
    ) -> Result<Vec<BucketAction>, tonic::Status> {
        self.send_within(report, Duration::from_secs(5)).await
    }

    async fn send_within(
        &mut self,
        report: RateLimitQuotaUsageReports,
        within: Duration,
    ) -> Result<Vec<BucketAction>, tonic::Status> {
        self.tx.send(report).await.expect("stream open");
        match tokio::time::timeout(within, self.rx.message()).await {
            Ok(Ok(Some(response))) => Ok(response.bucket_action),
            Ok(Ok(None)) => Err(tonic::Status::cancelled("stream ended")),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no answer within {within:?}"),
        }
    }
}

impl Gateway {
    /// An answer the server sends unasked within `within` (a push), or `None`.
    pub async fn pushed(&mut self, within: Duration) -> Option<Vec<BucketAction>> {
        match tokio::time::timeout(within, self.rx.message()).await {
            Ok(Ok(Some(response))) => Some(response.bucket_action),
            Ok(other) => panic!("the stream ended: {other:?}"),
            Err(_) => None,
        }
    }
}

/// Waits (bounded) until the server at `admin` has `streams` RLQS streams open: a stream the
/// gateway closed is gone, its holds released, once the gauge says so.
pub async fn await_streams(admin: u16, streams: u64) {
    let want = format!("portcullis_rlqs_streams {streams}");
    for _ in 0..200 {
        let (_, metrics) = super::http(admin, "GET", "/metrics", "").await;
        if metrics.lines().any(|l| l.trim() == want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the server never had {streams} RLQS streams open");
}

pub fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<HashMap<_, _>>(),
    }
}

/// What an action assigns, in words: `tokens 10/1s max 2 ttl 3s`, `allow_all`, `deny_all`,
/// `abandon`.
pub fn assigned(action: &BucketAction) -> String {
    match action.bucket_action.as_ref().expect("an action") {
        bucket_action::BucketAction::AbandonAction(_) => "abandon".into(),
        bucket_action::BucketAction::QuotaAssignmentAction(a) => {
            let ttl = a.assignment_time_to_live.expect("a ttl").seconds;
            match a
                .rate_limit_strategy
                .as_ref()
                .and_then(|s| s.strategy.as_ref())
            {
                Some(Strategy::TokenBucket(b)) => format!(
                    "tokens {}/{}s max {} ttl {ttl}s",
                    b.tokens_per_fill.unwrap_or(1),
                    b.fill_interval.map_or(0, |d| d.seconds),
                    b.max_tokens
                ),
                Some(Strategy::BlanketRule(r)) if *r == BlanketRule::AllowAll as i32 => {
                    format!("allow_all ttl {ttl}s")
                }
                Some(Strategy::BlanketRule(_)) => format!("deny_all ttl {ttl}s"),
                other => panic!("unexpected strategy {other:?}"),
            }
        }
    }
}

/// The rate of a token-bucket assignment ("tokens 1/2s ..." is 0.5).
pub fn tokens_per_second(assigned: &str) -> f64 {
    let rest = assigned
        .strip_prefix("tokens ")
        .unwrap_or_else(|| panic!("{assigned}"));
    let (tokens, rest) = rest.split_once('/').unwrap();
    let seconds = rest.split_once('s').unwrap().0;
    tokens.parse::<f64>().unwrap() / seconds.parse::<f64>().unwrap()
}

/// A client churning streams: `streams` streams opened one after another to `server` (on one
/// connection, or each on a new one: `each`), each reporting demand on `id` (domain `edge`) and
/// closed once answered; every 50 (every one with `each`), and at the end, waits until the
/// server has only `others` streams open again. Returns how many were granted tokens.
pub async fn churn(
    server: &TestServer,
    id: &[(&str, &str)],
    streams: usize,
    others: u64,
    each: bool,
) -> usize {
    let running = server.running.as_ref().unwrap();
    let admin = running.admin_addr.port();
    let endpoint =
        tonic::transport::Channel::from_shared(format!("http://{}", running.grpc_addr)).unwrap();
    let one = endpoint.connect().await.unwrap();
    let mut granted = 0;
    for i in 0..streams {
        let channel = if each {
            endpoint.connect().await.unwrap()
        } else {
            one.clone()
        };
        let mut stream = Gateway::over(channel).await;
        let actions = stream.report("edge", &[(id, 30, 0)]).await.unwrap();
        if assigned(&actions[0]).starts_with("tokens") {
            granted += 1;
        }
        drop(stream);
        // A stream's end reaches the server a little after the client drops it: on one
        // connection its live streams count at once, across connections only its ended ones do,
        // so each end is awaited there (else a loaded machine lets one more through).
        if each || i % 50 == 49 {
            await_streams(admin, others).await;
        }
    }
    await_streams(admin, others).await;
    granted
}

/// Gateways that reconnect (a connection age, a drain): `streams` streams to `server` one after
/// another, each from an address of its own (127.0.0.10 on: not one client churning), each
/// reporting demand on `id` (domain `edge`) and closed once answered, the server's end of it
/// awaited before the next. Returns how many were granted tokens.
pub async fn reconnects(server: &TestServer, id: &[(&str, &str)], streams: u8) -> usize {
    let admin = server.running.as_ref().unwrap().admin_addr.port();
    let mut granted = 0;
    for i in 0..streams {
        let mut stream = Gateway::open_from(server, [127, 0, 0, 10 + i].into()).await;
        let actions = stream.report("edge", &[(id, 30, 0)]).await.unwrap();
        if assigned(&actions[0]).starts_with("tokens") {
            granted += 1;
        }
        drop(stream);
        await_streams(admin, 0).await;
    }
    granted
}

/// RLS calls on `id` (domain `edge`) until one is refused: how many were admitted, never more
/// than `limit`.
pub async fn rls_takes_the_rest(server: &TestServer, id: &[(&str, &str)], limit: usize) -> usize {
    let mut admitted = 0;
    while server
        .call(super::request("edge", &[id]))
        .await
        .expect("RLS answers")
        .overall_code
        == portcullis::pb::rate_limit_response::Code::Ok as i32
    {
        admitted += 1;
        assert!(admitted <= limit, "past the limit of {limit}");
    }
    admitted
}

/// RLQS served with a report every second and no pushes: the churn and reconnect tests' server.
pub fn reports_every_second(s: &mut portcullis::settings::Settings) {
    s.rlqs.rlqs = true;
    s.rlqs.rlqs_reporting_interval = Duration::from_secs(1);
    s.rlqs.rlqs_push_interval = Duration::ZERO;
}

/// After `granted` reconnected gateways' claims on `id` (domain `edge`, 3,600 an hour) were
/// folded: a gateway at another address gets its part at its first report, then RLS takes the
/// rest of the hour, less by the folded claims (each at least one request, the next gateway's
/// another; at most 3 s at the whole rate each, of 24 streams).
pub async fn next_gateway_and_rls_after_folds(
    server: &TestServer,
    id: &[(&str, &str)],
    granted: usize,
) {
    let mut next = Gateway::open_from(server, [127, 0, 0, 2].into()).await;
    let actions = next.report("edge", &[(id, 30, 0)]).await.unwrap();
    assert!(
        assigned(&actions[0]).starts_with("tokens"),
        "{}",
        assigned(&actions[0])
    );
    let admitted = rls_takes_the_rest(server, id, 3_600).await;
    assert!(
        admitted < 3_600 - granted,
        "{admitted} admitted: the folded claims were not charged"
    );
    assert!(
        admitted > 3_600 - 24 * 8,
        "{admitted}: more than the claims were charged"
    );
}
