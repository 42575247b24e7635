//! A small etcd v3 client over the generated gRPC stubs: the key-value calls this store makes (range, put, delete,
//! compare-and-swap transactions), leases, and watch streams. Every unary call is bounded by [`CALL_TIMEOUT`], so an
//! unreachable etcd fails a state change quickly with [`StateError::Unavailable`] naming etcd.

use std::time::Duration;

use loragate_core::StateError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::url::EtcdUrl;

/// etcd's generated API (only what this crate calls is used).
#[allow(dead_code, missing_docs, unreachable_pub, clippy::all, clippy::pedantic, rust_2018_idioms)]
pub(crate) mod pb {
    pub(crate) mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    pub(crate) mod authpb {
        tonic::include_proto!("authpb");
    }
    pub(crate) mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
}

use pb::etcdserverpb::kv_client::KvClient;
use pb::etcdserverpb::lease_client::LeaseClient;
use pb::etcdserverpb::watch_client::WatchClient;
use pb::etcdserverpb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest,
    RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest, WatchResponse, compare, request_op,
    watch_request,
};
pub(crate) use pb::mvccpb::{Event, KeyValue, event::EventType};

/// The longest one unary etcd call may take.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// The most writes etcd takes in one transaction (its `--max-txn-ops` default).
pub(crate) const MAX_TXN_OPS: usize = 128;
/// The longest a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection to an etcd cluster (every endpoint of the URL, balanced). Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Etcd {
    channel: Channel,
    /// The endpoints, for errors.
    endpoints: String,
}

/// One write of a transaction.
#[derive(Clone, Debug)]
pub(crate) enum Write {
    /// Puts a value, under a lease (0: none).
    Put { key: String, value: Vec<u8>, lease: i64 },
    /// Deletes a key, or every key under a prefix.
    Delete { key: String, prefix: bool },
}

/// What a transaction requires of a key.
#[derive(Clone, Debug)]
pub(crate) enum Guard {
    /// The key was last written at this revision (0: it does not exist).
    ModRevision { key: String, revision: i64 },
}

impl Etcd {
    /// A lazy connection: nothing is dialled until the first call.
    pub(crate) fn connect(url: &EtcdUrl) -> Result<Self, StateError> {
        let endpoints = url
            .endpoints()
            .iter()
            .map(|host| {
                Endpoint::from_shared(format!("http://{host}"))
                    .map(|endpoint| endpoint.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true))
                    .map_err(|err| StateError::Failed(format!("etcd endpoint {host}: {err}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { channel: Channel::balance_list(endpoints.into_iter()), endpoints: url.endpoints().join(",") })
    }

    /// A state error for a failed etcd call: unreachable (or timed out) is [`StateError::Unavailable`], naming etcd.
    pub(crate) fn error(&self, what: &str, status: &tonic::Status) -> StateError {
        use tonic::Code;
        let message = format!("etcd ({}) {what}: {}", self.endpoints, status.message());
        match status.code() {
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown | Code::Aborted => {
                StateError::Unavailable(message)
            }
            _ => StateError::Failed(message),
        }
    }

    fn timed_out(&self, what: &str) -> StateError {
        StateError::Unavailable(format!("etcd ({}) {what}: no answer within {CALL_TIMEOUT:?}", self.endpoints))
    }

    /// Runs one unary call within [`CALL_TIMEOUT`].
    async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, StateError> {
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(self.error(what, &status)),
            Err(_) => Err(self.timed_out(what)),
        }
    }

    /// Every key under `prefix` (or the one key `key` when `prefix` is false), with the revision read at.
    pub(crate) async fn range(&self, key: &str, prefix: bool) -> Result<(Vec<KeyValue>, i64), StateError> {
        let request = RangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: if prefix { prefix_end(key) } else { Vec::new() },
            ..Default::default()
        };
        let mut client = KvClient::new(self.channel.clone());
        let response = self.call("read", client.range(request)).await?;
        Ok((response.kvs, response.header.map_or(0, |header| header.revision)))
    }

    /// Applies `writes` atomically if every guard holds; returns whether they held and the revision after.
    pub(crate) async fn txn(&self, guards: Vec<Guard>, writes: Vec<Write>) -> Result<(bool, i64), StateError> {
        let compare = guards
            .into_iter()
            .map(|Guard::ModRevision { key, revision }| Compare {
                result: compare::CompareResult::Equal.into(),
                target: compare::CompareTarget::Mod.into(),
                key: key.into_bytes(),
                target_union: Some(compare::TargetUnion::ModRevision(revision)),
                range_end: Vec::new(),
            })
            .collect();
        let success = writes
            .into_iter()
            .map(|write| RequestOp {
                request: Some(match write {
                    Write::Put { key, value, lease } => request_op::Request::RequestPut(PutRequest {
                        key: key.into_bytes(),
                        value,
                        lease,
                        ..Default::default()
                    }),
                    Write::Delete { key, prefix } => request_op::Request::RequestDeleteRange(DeleteRangeRequest {
                        range_end: if prefix { prefix_end(&key) } else { Vec::new() },
                        key: key.into_bytes(),
                        ..Default::default()
                    }),
                }),
            })
            .collect();
        let request = TxnRequest { compare, success, failure: Vec::new() };
        let mut client = KvClient::new(self.channel.clone());
        let response = self.call("write", client.txn(request)).await?;
        Ok((response.succeeded, response.header.map_or(0, |header| header.revision)))
    }

    /// A new lease of `ttl` (at least 1 s); its id.
    pub(crate) async fn grant_lease(&self, ttl: Duration) -> Result<i64, StateError> {
        let ttl = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut client = LeaseClient::new(self.channel.clone());
        let response = self.call("lease grant", client.lease_grant(LeaseGrantRequest { ttl, id: 0 })).await?;
        if !response.error.is_empty() {
            return Err(StateError::Failed(format!("etcd ({}) lease grant: {}", self.endpoints, response.error)));
        }
        Ok(response.id)
    }

    /// Ends a lease (its keys go).
    pub(crate) async fn revoke_lease(&self, id: i64) -> Result<(), StateError> {
        let mut client = LeaseClient::new(self.channel.clone());
        self.call("lease revoke", client.lease_revoke(LeaseRevokeRequest { id })).await.map(drop)
    }

    /// Renews a lease once; returns its TTL left (0: it had expired).
    pub(crate) async fn keep_alive(&self, id: i64) -> Result<i64, StateError> {
        let mut client = LeaseClient::new(self.channel.clone());
        let requests = futures::stream::once(std::future::ready(LeaseKeepAliveRequest { id }));
        let mut responses = self.call("lease keep-alive", client.lease_keep_alive(requests)).await?;
        match tokio::time::timeout(CALL_TIMEOUT, responses.message()).await {
            Ok(Ok(Some(response))) => Ok(response.ttl),
            Ok(Ok(None)) => {
                Err(StateError::Unavailable(format!("etcd ({}) lease keep-alive: no answer", self.endpoints)))
            }
            Ok(Err(status)) => Err(self.error("lease keep-alive", &status)),
            Err(_) => Err(self.timed_out("lease keep-alive")),
        }
    }

    /// Watches every key under `prefix` from `start_revision` on (history included).
    pub(crate) async fn watch(&self, prefix: &str, start_revision: i64) -> Result<Watch, StateError> {
        let (requests, outgoing) = mpsc::unbounded_channel();
        let create = WatchCreateRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            start_revision,
            ..Default::default()
        };
        let _ = requests.send(WatchRequest { request_union: Some(watch_request::RequestUnion::CreateRequest(create)) });
        let mut client = WatchClient::new(self.channel.clone());
        let mut responses = self.call("watch", client.watch(UnboundedReceiverStream::new(outgoing))).await?;
        // Created once etcd says so; anything else it said first is for `next`.
        let first = match tokio::time::timeout(CALL_TIMEOUT, responses.message()).await {
            Ok(Ok(Some(response))) => response,
            Ok(Ok(None)) => return Err(StateError::Unavailable(format!("etcd ({}) ended the watch", self.endpoints))),
            Ok(Err(status)) => return Err(self.error("watch", &status)),
            Err(_) => return Err(self.timed_out("watch")),
        };
        let pending = (!first.created || !first.events.is_empty() || first.compact_revision > 0).then_some(first);
        Ok(Watch { _requests: requests, responses, pending, etcd: self.clone() })
    }
}

/// A watch stream (dropping it cancels the watch).
pub(crate) struct Watch {
    _requests: mpsc::UnboundedSender<WatchRequest>,
    responses: tonic::Streaming<WatchResponse>,
    /// A response read while waiting for the watch to be created, not handed out yet.
    pending: Option<WatchResponse>,
    etcd: Etcd,
}

/// What a watch stream delivered next.
pub(crate) enum Watched {
    /// Events, in revision order.
    Events(Vec<Event>),
    /// The start revision was compacted away: the history since then is gone.
    Compacted,
}

impl Watch {
    /// The next batch of events; an error when the stream broke (etcd unreachable).
    pub(crate) async fn next(&mut self) -> Result<Watched, StateError> {
        loop {
            let next = match self.pending.take() {
                Some(response) => Ok(Some(response)),
                None => self.responses.message().await,
            };
            match next {
                Ok(Some(response)) if response.compact_revision > 0 => return Ok(Watched::Compacted),
                Ok(Some(response)) if response.canceled => {
                    return Err(StateError::Unavailable(format!(
                        "etcd ({}) cancelled the watch: {}",
                        self.etcd.endpoints, response.cancel_reason
                    )));
                }
                Ok(Some(response)) if response.events.is_empty() => {}
                Ok(Some(response)) => return Ok(Watched::Events(response.events)),
                Ok(None) => {
                    return Err(StateError::Unavailable(format!("etcd ({}) ended the watch", self.etcd.endpoints)));
                }
                Err(status) => return Err(self.etcd.error("watch", &status)),
            }
        }
    }
}

/// The end of the key range of every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: to the end of the key space.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_range_ends_after_its_last_byte() {
        assert_eq!(prefix_end("/lg/"), b"/lg0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
