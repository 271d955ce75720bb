//! Seeded random simulation of the pool against a shadow model that follows the reference's
//! words literally: "the k-th fresh assignment since the last POOL goes to up[k mod len(up)],
//! where up is the list of UP backends in pool order at that moment".
//!
//! Replay a failing run with `LIMPET_SEED=<seed> cargo test -p limpet-core --test pool_simulation`.

use limpet_core::{Decision, Pool};

/// xorshift64*: tiny, deterministic, good enough to pick actions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The shadow model: names, an UP flag each, and k.
struct Shadow {
    names: Vec<String>,
    up: Vec<bool>,
    k: usize,
}

impl Shadow {
    fn request(&mut self, cookie: Option<&str>) -> Option<(String, bool)> {
        if let Some(c) = cookie {
            if let Some(i) = self.names.iter().position(|n| n == c) {
                if self.up[i] {
                    return Some((c.to_owned(), false));
                }
            }
        }
        let up: Vec<&String> = self
            .names
            .iter()
            .zip(&self.up)
            .filter(|(_, u)| **u)
            .map(|(n, _)| n)
            .collect();
        if up.is_empty() {
            return None;
        }
        let chosen = up[self.k % up.len()].clone();
        self.k += 1;
        Some((chosen, true))
    }
}

fn run(seed: u64, steps: usize) {
    let mut rng = Rng(seed | 1);
    let universe: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
    let mut pool = Pool::new(["n0", "n1"]).expect("pool");
    let mut shadow = Shadow {
        names: vec!["n0".into(), "n1".into()],
        up: vec![true, true],
        k: 0,
    };
    for step in 0..steps {
        match rng.below(10) {
            0 => {
                // POOL with 0..5 distinct names in a random order.
                let mut names = universe.clone();
                let n = rng.below(6) as usize;
                for i in 0..names.len() {
                    let j = i + rng.below((names.len() - i) as u64) as usize;
                    names.swap(i, j);
                }
                names.truncate(n);
                pool = Pool::new(names.clone()).expect("distinct names");
                shadow = Shadow {
                    up: vec![true; names.len()],
                    names,
                    k: 0,
                };
            }
            1 | 2 => {
                let name = &universe[rng.below(6) as usize];
                let up = rng.below(2) == 0;
                if let Some(id) = pool.lookup(name.as_bytes()) {
                    pool.force_health(id, up);
                }
                if let Some(i) = shadow.names.iter().position(|n| n == name) {
                    shadow.up[i] = up;
                }
            }
            _ => {
                let cookie = match rng.below(3) {
                    0 => None,
                    1 => Some(universe[rng.below(6) as usize].clone()),
                    _ => Some("stranger".to_owned()),
                };
                let pin = pool.pin_by_name(cookie.as_deref().map(str::as_bytes));
                let got = match pool.decide(pin, 0) {
                    Decision::Sticky(n) => Some((pool.name(n).to_owned(), false)),
                    Decision::Fresh { node, repin } => {
                        assert_eq!(repin.is_some(), cookie.is_some(), "seed {seed} step {step}");
                        Some((pool.name(node).to_owned(), true))
                    }
                    Decision::Unavailable => None,
                };
                let want = shadow.request(cookie.as_deref());
                assert_eq!(got, want, "seed {seed} step {step}: cookie {cookie:?}");
            }
        }
        assert_eq!(
            pool.rotation() as usize,
            shadow.k,
            "seed {seed} step {step}"
        );
    }
}

#[test]
fn pool_agrees_with_the_literal_rule() {
    match std::env::var("LIMPET_SEED") {
        Ok(seed) => run(seed.parse().expect("LIMPET_SEED is a number"), 20_000),
        Err(_) => {
            for seed in 1..=64u64 {
                run(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 2_000);
            }
        }
    }
}
