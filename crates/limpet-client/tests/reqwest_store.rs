//! The reqwest adapter against a real HTTP server on loopback.

mod common;

use std::sync::Arc;

use common::{http_server, response};
use limpet_client::reqwest::AffinityCookieStore;
use limpet_client::{classify, AffinityJar, Origin, Outcome, SharedJar, Verdict};

fn client_for(url: &str) -> (reqwest::Client, Arc<AffinityCookieStore>) {
    let jar = SharedJar::new(AffinityJar::new(Origin::parse(url).expect("origin")));
    let store = Arc::new(AffinityCookieStore::new(jar));
    let client = reqwest::Client::builder()
        // A proxy from the environment must not stand between the test and its server.
        .no_proxy()
        .cookie_provider(Arc::clone(&store))
        .build()
        .expect("client");
    (client, store)
}

#[tokio::test]
async fn keeps_the_balancer_cookie_drops_the_foreign_one_and_sends_the_pin_back() {
    let mut server = http_server(vec![
        response(
            200,
            &["route=n1; Path=/; HttpOnly", "theme=dark; Path=/"],
            "discovered",
        ),
        response(200, &[], "jobs"),
    ])
    .await;
    let (client, store) = client_for(&server.url("http", "/"));

    let first = client
        .get(server.url("http", "/discovery"))
        .send()
        .await
        .expect("first");
    assert_eq!(first.status(), 200);
    assert_eq!(server.next_request().await.cookie(), None);

    let second = client
        .get(server.url("http", "/jobs"))
        .send()
        .await
        .expect("second");
    assert_eq!(second.status(), 200);
    let head = server.next_request().await;
    assert_eq!(head.cookie(), Some("route=n1"), "{head:?}");

    assert_eq!(store.jar().get("route").as_deref(), Some("n1"));
    assert_eq!(store.jar().get("theme"), None);
    assert_eq!(store.jar().lock().len(), 1);
}

#[tokio::test]
async fn refusals_rewrite_the_pin_and_expiry_removes_it() {
    let mut server = http_server(vec![
        response(200, &["route=n1; Path=/"], ""),
        // The pinned node is gone: the balancer answers 503 and re-pins in the same answer.
        response(503, &["route=n2; Path=/"], "unavailable"),
        response(409, &["route=; Path=/; Max-Age=0"], "conflict"),
        response(200, &[], ""),
    ])
    .await;
    let (client, store) = client_for(&server.url("http", "/"));
    let mut seen = Vec::new();
    let mut verdicts = Vec::new();
    for _ in 0..4 {
        let answer = client
            .get(server.url("http", "/claim"))
            .send()
            .await
            .expect("answer");
        verdicts.push(classify(Outcome::RequestAnswered(answer.status().as_u16())));
        seen.push(server.next_request().await.cookie().map(str::to_owned));
    }
    assert_eq!(
        seen,
        [
            None,
            Some("route=n1".to_owned()),
            Some("route=n2".to_owned()),
            None
        ]
    );
    // Neither the 503 nor the 409 ended the session.
    assert!(verdicts.iter().all(|v| *v == Verdict::HandBack));
    assert!(store.jar().lock().is_empty());
}

#[tokio::test]
async fn the_applications_own_cookie_goes_beside_the_pin_through_attach() {
    let mut server = http_server(vec![
        response(
            200,
            &[
                "AWSALB=abc; Path=/",
                "AWSALBCORS=abc; Path=/; SameSite=None",
            ],
            "",
        ),
        response(200, &[], ""),
        response(200, &[], ""),
    ])
    .await;
    let (client, store) = client_for(&server.url("http", "/"));
    client
        .get(server.url("http", "/"))
        .send()
        .await
        .expect("first");
    server.next_request().await;

    // reqwest skips the store when the request has a Cookie header of its own: this is the
    // trap `attach` exists for.
    let without = client
        .get(server.url("http", "/"))
        .header(reqwest::header::COOKIE, "sid=s3cr3t")
        .send()
        .await
        .expect("without attach");
    assert_eq!(without.status(), 200);
    assert_eq!(server.next_request().await.cookie(), Some("sid=s3cr3t"));

    let mut request = client
        .get(server.url("http", "/"))
        .header(reqwest::header::COOKIE, "sid=s3cr3t")
        .build()
        .expect("request");
    store.attach(&mut request);
    client.execute(request).await.expect("with attach");
    assert_eq!(
        server.next_request().await.cookie(),
        Some("sid=s3cr3t; AWSALB=abc; AWSALBCORS=abc")
    );
}

#[tokio::test]
async fn another_origin_neither_sets_nor_receives_the_pin() {
    let mut home = http_server(vec![
        response(200, &["route=n1; Path=/"], ""),
        response(200, &[], ""),
    ])
    .await;
    let mut idp = http_server(vec![response(200, &["route=evil; Path=/"], "")]).await;
    let (client, store) = client_for(&home.url("http", "/"));

    client
        .get(home.url("http", "/"))
        .send()
        .await
        .expect("home");
    home.next_request().await;
    // Same host, another port: another origin.
    client
        .get(idp.url("http", "/token"))
        .send()
        .await
        .expect("idp");
    assert_eq!(idp.next_request().await.cookie(), None);
    client
        .get(home.url("http", "/"))
        .send()
        .await
        .expect("home again");
    assert_eq!(home.next_request().await.cookie(), Some("route=n1"));
    assert_eq!(store.jar().get("route").as_deref(), Some("n1"));
}

#[tokio::test]
async fn connection_dropped_without_answer_is_a_transport_failure() {
    // The server reads the request and closes without a byte of answer.
    let mut server = http_server(vec![String::new()]).await;
    let (client, _store) = client_for(&server.url("http", "/"));
    let error = client
        .post(server.url("http", "/claim"))
        .send()
        .await
        .expect_err("no answer");
    server.next_request().await;
    let outcome = limpet_client::reqwest::outcome_of_error(&error);
    assert_eq!(outcome, Outcome::RequestTransportFailed, "{error}");
    let verdict = classify(outcome);
    assert_eq!(verdict, Verdict::HandBack);
    assert!(verdict.keeps_session());
}
