//! Keep a balancer's pin across plain HTTP requests with reqwest.
//!
//! ```text
//! cargo run -p limpet-client --features reqwest --example reqwest -- http://127.0.0.1:8080/
//! ```
//! Sends a few requests to the URL, printing what each answer said and which balancer cookies
//! the jar holds afterwards; every request after the first carries them.

use std::sync::Arc;

use limpet_client::reqwest::{outcome_of_error, AffinityCookieStore};
use limpet_client::{classify, AffinityJar, Origin, Outcome, SharedJar};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = std::env::args().nth(1) else {
        return Err("usage: reqwest <URL>".into());
    };
    let jar = SharedJar::new(AffinityJar::new(Origin::parse(&url)?));
    let store = Arc::new(AffinityCookieStore::new(jar.clone()));
    // Requests carry a `Cookie` of their own (merged by `attach`), which reqwest would send
    // unchanged on every hop of a redirect: redirects are not followed, so that one whose
    // answer moved the pin is followed (if at all) as a new request, attached again.
    let client = reqwest::Client::builder()
        .cookie_provider(Arc::clone(&store))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;

    for i in 1..=3 {
        // The application's own cookie, merged with the jar's by `attach`.
        let mut request = client
            .get(&url)
            .header(reqwest::header::COOKIE, "app-session=example")
            .build()?;
        store.attach(&mut request);
        let sent = request
            .headers()
            .get(reqwest::header::COOKIE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let outcome = match client.execute(request).await {
            Ok(answer) => Outcome::RequestAnswered(answer.status().as_u16()),
            Err(error) => {
                println!("request {i}: {error}");
                outcome_of_error(&error)
            }
        };
        println!(
            "request {i}: sent Cookie {sent:?}; {outcome:?} -> {:?}",
            classify(outcome)
        );
        let now = jar.now();
        for cookie in jar.lock().cookies(now) {
            println!("  jar: {}={}", cookie.name(), cookie.value());
        }
    }
    Ok(())
}
