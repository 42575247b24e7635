//! A TCP proxy between one replica and etcd that a test can cut (every connection dropped, new ones refused) and
//! mend: from etcd's side, a cut replica is one that died or was partitioned away.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy (stopped when dropped).
pub(crate) struct Proxy {
    address: SocketAddr,
    open: Arc<watch::Sender<bool>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Forwards a free loopback port to `upstream`.
    pub(crate) async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a proxy port");
        let address = listener.local_addr().expect("its address");
        let open = Arc::new(watch::Sender::new(true));
        let accept_open = open.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if !*accept_open.borrow() {
                    continue; // Cut: refused (dropped at once).
                }
                let mut cut = accept_open.subscribe();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream).await else { return };
                    let mut client = client;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.wait_for(|open| !open) => {}
                    }
                });
            }
        });
        Self { address, open, accept }
    }

    /// `HOST:PORT` a replica connects to.
    pub(crate) fn endpoint(&self) -> String {
        self.address.to_string()
    }

    /// Drops every connection and refuses new ones.
    pub(crate) fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Forwards again.
    pub(crate) fn mend(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
