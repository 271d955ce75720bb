//! Helpers of the admin and stats-page tests: a running admin server on port 0 with its
//! shutdown guard, and a `Control` over a real decision core (`limpet_core::Pool`) for the
//! parts that do not need the multi-listener runtime.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use limpet::admin::{
    AdminSettings, BoxFuture, Control, ControlError, DrainView, EntryView, NodeCommand, NodeView,
    ReloadReport, TablePage, TableView,
};
use limpet::metrics::Metrics;
use limpet_core::{AdminState, Pool};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub mod lifecycle;

/// A `Control` over a real `Pool`, with no tables and no config file.
pub struct PoolControl {
    pub pool: Mutex<Pool>,
    pub metrics: Arc<Metrics>,
}

impl PoolControl {
    pub fn new(names: &[&str]) -> Arc<Self> {
        Arc::new(PoolControl {
            pool: Mutex::new(Pool::new(names.iter().copied()).unwrap_or_else(|e| panic!("{e}"))),
            metrics: Arc::new(Metrics::new()),
        })
    }

    pub fn state_of(&self, node: &str) -> &'static str {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.lookup(node.as_bytes())
            .and_then(|id| pool.state(id))
            .map_or("?", |s| s.as_str())
    }
}

impl Control for PoolControl {
    fn nodes(&self) -> Vec<NodeView> {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.nodes()
            .map(|(_, n)| NodeView {
                name: n.name().to_owned(),
                address: "127.0.0.1".into(),
                weight: n.weight(),
                state: n.state().as_str(),
                admin: match n.admin() {
                    AdminState::Ready => "ready",
                    AdminState::Drain { .. } => "drain",
                    AdminState::Maint => "maint",
                },
                healthy: n.health().is_up(),
                drain: match n.admin() {
                    AdminState::Drain {
                        deadline_ms,
                        spread_ms,
                    } => Some(DrainView {
                        deadline_unix_ms: deadline_ms,
                        spread_ms,
                        complete: u64::from(n.active()) == 0,
                    }),
                    _ => None,
                },
                active_connections: u64::from(n.active()),
                tunnels: 0,
                table_pins: 0,
                sessions_seen: 0,
                seen_window_secs: 600,
                last_seen_ago_ms: None,
                checks: Vec::new(),
            })
            .collect()
    }

    fn set_node(&self, node: &str, cmd: NodeCommand) -> Result<NodeView, ControlError> {
        {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            let id = pool
                .lookup(node.as_bytes())
                .ok_or_else(|| ControlError::NotFound(format!("no node {node:?}")))?;
            let admin = match cmd {
                NodeCommand::Ready => AdminState::Ready,
                NodeCommand::Maint => AdminState::Maint,
                NodeCommand::Drain { deadline, spread } => AdminState::Drain {
                    deadline_ms: deadline.map(|d| d.as_millis() as u64),
                    spread_ms: spread.map_or(0, |d| d.as_millis() as u64),
                },
            };
            pool.set_admin(id, admin);
        }
        self.nodes()
            .into_iter()
            .find(|n| n.name == node)
            .ok_or_else(|| ControlError::NotFound(node.to_owned()))
    }

    fn tables(&self) -> Vec<TableView> {
        Vec::new()
    }

    fn table_page(&self, table: &str, _: usize, _: usize) -> Result<TablePage, ControlError> {
        Err(ControlError::NotFound(format!("no table {table:?}")))
    }

    fn table_get(&self, table: &str, _: &str) -> Result<Option<EntryView>, ControlError> {
        Err(ControlError::NotFound(format!("no table {table:?}")))
    }

    fn table_delete(&self, table: &str, _: &str) -> Result<bool, ControlError> {
        Err(ControlError::NotFound(format!("no table {table:?}")))
    }

    fn table_clear(&self, table: &str) -> Result<u64, ControlError> {
        Err(ControlError::NotFound(format!("no table {table:?}")))
    }

    fn reload(&self) -> BoxFuture<'_, Result<ReloadReport, ControlError>> {
        Box::pin(async { Err(ControlError::Refused("no configuration file".into())) })
    }

    fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }
}

/// A running admin server; stops when dropped.
pub struct Admin {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Admin {
    pub async fn start(bind: &str, control: Arc<dyn Control>, token: Option<&str>) -> Admin {
        let listener = TcpListener::bind(bind)
            .await
            .unwrap_or_else(|e| panic!("bind {bind}: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let settings = AdminSettings {
            listen: addr,
            token: token.map(str::to_owned),
        };
        settings.validate().unwrap_or_else(|e| panic!("{e}"));
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(limpet::admin::serve(listener, control, settings, async {
            let _ = rx.await;
        }));
        Admin {
            addr,
            stop: Some(tx),
            task,
        }
    }

    /// The base URL, reached over loopback whatever the bound address.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.addr.port())
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_else(|e| panic!("{e}"))
}
