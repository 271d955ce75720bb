//! Cookie value codecs: the per-request cost of reading and writing the affinity cookie.
//!
//! What to look for: a signed read of a valid token should cost a few HMAC-SHA256 blocks and not
//! grow with the pool (the 3-node and 1000-node figures should match); a forged token costs one
//! unmask + MAC per configured key; an oversized value costs nothing.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use limpet_core::{CookieCodec, NodeId, Pool, SignedCodec};

const T0: u64 = 1_700_000_000_000;
const KEYS: [&[u8]; 3] = [
    b"bench key number one, 32 bytes..",
    b"bench key number two, 32 bytes..",
    b"bench key number three, 32 byte.",
];

fn pool(n: usize) -> Pool {
    Pool::new((0..n).map(|i| format!("node-{i}"))).unwrap_or_else(|e| panic!("bench pool: {e}"))
}

fn signed(keys: &[&[u8]], p: &Pool) -> CookieCodec {
    CookieCodec::Signed(
        SignedCodec::new(
            keys,
            Duration::from_secs(1800),
            Duration::from_secs(86_400),
            p,
        )
        .unwrap_or_else(|e| panic!("bench codec: {e}")),
    )
}

fn bench_codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");

    let small = pool(3);
    let name = CookieCodec::Name;
    g.bench_function("name/read", |b| {
        b.iter(|| name.read(black_box(Some(b"node-2")), &small, T0))
    });

    for n in [3usize, 1000] {
        let p = pool(n);
        let codec = signed(&KEYS[..1], &p);
        let node = NodeId(u32::try_from(n - 1).unwrap_or(0));
        let token = codec.write(node, &p, T0, T0);
        g.bench_with_input(BenchmarkId::new("signed/read-valid", n), &n, |b, _| {
            b.iter(|| codec.read(black_box(Some(token.as_bytes())), &p, T0 + 1000))
        });
        g.bench_with_input(BenchmarkId::new("signed/write", n), &n, |b, _| {
            b.iter(|| codec.write(black_box(node), &p, T0, T0 + 1000))
        });
    }

    // A valid token under the last of three keys: the worst case of a rotation.
    let p = pool(3);
    let old = signed(&KEYS[2..], &p).write(NodeId(1), &p, T0, T0);
    let rotated = signed(&KEYS, &p);
    g.bench_function("signed/read-old-key-of-3", |b| {
        b.iter(|| rotated.read(black_box(Some(old.as_bytes())), &p, T0 + 1000))
    });
    // A well-formed forgery (right length and version, made under a key we do not hold):
    // every key is tried.
    let forged = signed(&[b"a key this codec does not know..."], &p).write(NodeId(0), &p, T0, T0);
    g.bench_function("signed/read-forged-3-keys", |b| {
        b.iter(|| rotated.read(black_box(Some(forged.as_bytes())), &p, T0))
    });
    // An oversized value is refused on its length alone.
    let huge = "A".repeat(8192);
    g.bench_function("signed/read-oversized", |b| {
        b.iter(|| rotated.read(black_box(Some(huge.as_bytes())), &p, T0))
    });

    let big = pool(1000);
    let codec = signed(&KEYS[..2], &big);
    g.bench_function("signed/build-1000-nodes-2-keys", |b| {
        b.iter(|| match &codec {
            CookieCodec::Signed(s) => s.for_pool(black_box(&big)).is_ok(),
            CookieCodec::Name | CookieCodec::NameRenewed => false,
        })
    });
    g.finish();
}

criterion_group!(benches, bench_codec);
criterion_main!(benches);
