//! `limpet demo`: limpet's main job on an embedded setup, with no arguments and no files.
//!
//! Three built-in nodes ([`crate::backend`]) listen on loopback ports chosen by the system; the
//! proxy listens in front of them on 127.0.0.1:8080, or on a free port when 8080 is taken.
//! Everything runs in this one process: Ctrl-C stops the proxy first (it stops accepting and
//! lets in-flight requests finish), then the nodes. SIGTERM does the same.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::proxy::config::{NodeConfig, ProxyConfig};

/// The demo nodes' names: what the cookie carries and the pages show.
pub const NODES: [&str; 3] = ["alpha", "bravo", "charlie"];

/// Arguments of `limpet demo` (all optional).
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Address for the proxy; when the default is taken, a free port is used instead.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
}

/// Runs the demo until Ctrl-C.
pub fn run(args: DemoArgs) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("limpet demo: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(demo(args.listen))
}

async fn demo(listen: SocketAddr) -> ExitCode {
    // Each node gets a port chosen by the system: nothing to collide with.
    let (stop_nodes, nodes_stopped) = watch::channel(false);
    let mut node_tasks = Vec::new();
    let mut nodes = Vec::new();
    for name in NODES {
        let listener = match TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("limpet demo: cannot bind a node on loopback: {e}");
                return ExitCode::FAILURE;
            }
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("limpet demo: {e}");
                return ExitCode::FAILURE;
            }
        };
        nodes.push(NodeConfig {
            name: name.to_owned(),
            addr,
        });
        let mut stopped = nodes_stopped.clone();
        node_tasks.push(tokio::spawn(async move {
            crate::backend::serve(name, listener, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
        }));
    }

    let listener = match TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(first) => match TcpListener::bind(SocketAddr::new(listen.ip(), 0)).await {
            Ok(l) => {
                eprintln!("limpet demo: {listen} is not free ({first}); using another port");
                l
            }
            Err(e) => {
                eprintln!("limpet demo: cannot listen on {}: {e}", listen.ip());
                return ExitCode::FAILURE;
            }
        },
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("limpet demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    print_welcome(addr, &nodes);

    let shutdown = async {
        crate::proxy::quick::stop_signal().await;
        tracing::info!("stopping the demo");
    };
    let result = crate::proxy::serve(ProxyConfig::new(nodes), listener, shutdown).await;
    let _ = stop_nodes.send(true);
    for task in node_tasks {
        let _ = task.await;
    }
    match result {
        Ok(()) => {
            println!("limpet demo stopped.");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("limpet demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_welcome(addr: SocketAddr, nodes: &[NodeConfig]) {
    let mut out = std::io::stdout().lock();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let _ = write!(
        out,
        "listening on {addr}\n\
         \n\
         limpet is balancing three demo nodes ({names}) with cookie affinity.\n\
         \n\
         Try it with a cookie jar: the first answer pins you (Set-Cookie: route=...),\n\
         every later one comes from the same node:\n\
         \n\
         \x20 curl -si -c /tmp/limpet-demo.jar -b /tmp/limpet-demo.jar http://{addr}/\n\
         \n\
         Without the jar, each request is a fresh assignment and the nodes take turns:\n\
         \n\
         \x20 for i in 1 2 3; do curl -s http://{addr}/; echo; done\n\
         \n\
         In a browser, http://{addr}/index.html shows the node that served the page and opens\n\
         a WebSocket that lands on the same node.\n\
         \n\
         Ctrl-C stops everything.\n",
        names = names.join(", "),
    );
    let _ = out.flush();
}
