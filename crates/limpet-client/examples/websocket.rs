//! Open a WebSocket that keeps the balancer's pin, reconnecting with backoff.
//!
//! ```text
//! cargo run -p limpet-client --features tungstenite --example websocket -- ws://127.0.0.1:8080/socket
//! ```
//! Tries the upgrade up to five times: cookies of every answer, a refusal included, are
//! adopted and sent on the next attempt; the failure table decides whether to wait and retry.
//! An application also makes its discovery request (an HTTP request through the same jar,
//! e.g. with the `reqwest` adapter) right before each attempt, so the socket opens on the node
//! its requests reach; this example, which has the socket alone, has nothing to discover.
//! Once open, sends one text message, prints the first message back, and closes.

use futures_util::{SinkExt, StreamExt};
use limpet_client::tungstenite::{connect_async, outcome_of_error};
use limpet_client::{classify, AffinityJar, Backoff, Origin, SharedJar, Verdict};
use tokio_tungstenite::tungstenite::Message;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = std::env::args().nth(1) else {
        return Err("usage: websocket <ws://... URL>".into());
    };
    let jar = SharedJar::new(AffinityJar::new(Origin::parse(&url)?));
    let mut backoff = Backoff::new();

    for attempt in 1..=5 {
        let cookie = jar.cookie_header(&jar.origin());
        println!("attempt {attempt}: sending Cookie {cookie:?}");
        match connect_async(&jar, url.as_str()).await {
            Ok((mut socket, answer)) => {
                println!(
                    "upgraded ({}); jar: {:?}",
                    answer.status(),
                    jar.cookie_header(&jar.origin())
                );
                socket.send(Message::text("hello")).await?;
                if let Some(message) = socket.next().await {
                    println!("received: {:?}", message?);
                }
                socket.close(None).await?;
                return Ok(());
            }
            Err(error) => {
                let outcome = outcome_of_error(&error);
                let verdict = classify(outcome);
                println!("attempt {attempt}: {error} ({outcome:?} -> {verdict:?})");
                match verdict {
                    Verdict::RetryLater => {
                        let delay = backoff.next_delay();
                        println!("retrying in {delay:?}");
                        tokio::time::sleep(delay).await;
                    }
                    Verdict::HandBack => return Err(error.into()),
                    Verdict::AuthorisationWithdrawn => {
                        jar.clear();
                        return Err("authorisation withdrawn: sign in again".into());
                    }
                }
            }
        }
    }
    Err("gave up after 5 attempts".into())
}
