//! The core decision on typical request heads: cut the head, find the pin, decide.
//! This is the per-REQUEST work of `limpet sim` and of the proxy's affinity step.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use limpet_core::head::{cookie_in_head, head_end, HeadEnd};
use limpet_core::{Decision, Pool};
use std::hint::black_box;

const STICKY: &[u8] = b"GET /cart/items?page=2 HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) Gecko/20100101 Firefox/128.0\r\nAccept: text/html,application/xhtml+xml\r\nAccept-Language: en-GB,en;q=0.5\r\nCookie: theme=dark; _ga=GA1.2.123456789.1700000000; route=b2; lang=en\r\nConnection: keep-alive\r\n\r\n";
const FRESH: &[u8] =
    b"GET /cart HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n";

fn decide(pool: &mut Pool, buf: &[u8]) -> Option<u32> {
    let HeadEnd::Complete { head, .. } = head_end(buf, 0) else {
        return None;
    };
    let pin = pool.pin_by_name(cookie_in_head(&buf[..head], b"route"));
    match pool.decide(pin, 0) {
        Decision::Sticky(n) | Decision::Fresh { node: n, .. } => Some(n.0),
        Decision::Unavailable => None,
    }
}

fn bench(c: &mut Criterion) {
    let mut pool = Pool::new(["b1", "b2", "b3"]).expect("pool");
    let mut g = c.benchmark_group("decide");
    g.throughput(Throughput::Elements(1));
    g.bench_function("sticky_browser_head", |b| {
        b.iter(|| decide(&mut pool, black_box(STICKY)))
    });
    g.bench_function("fresh_curl_head", |b| {
        b.iter(|| decide(&mut pool, black_box(FRESH)))
    });
    let mut big = Pool::new((0..1000).map(|i| format!("node-{i}"))).expect("pool");
    let head = b"GET / HTTP/1.1\r\nCookie: route=node-777\r\n\r\n";
    g.bench_function("sticky_1000_nodes", |b| {
        b.iter(|| decide(&mut big, black_box(head)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
