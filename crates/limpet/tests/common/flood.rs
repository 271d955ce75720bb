//! A node that floods a peer which stopped reading: the writing side of the stalled-tunnel
//! tests (`adversarial`, `adversarial_admin`). Depends on tokio only, so both helper trees
//! include it.

use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::oneshot;

/// Writes `unit` to `w` again and again, at most 4096 times (64 MiB in 16 KiB units, far more
/// than any socket buffers hold). The first time a write stays blocked for 200 ms, `blocked`
/// is told; the writing goes on until a write fails (the tunnel was closed: true) or the
/// bound is reached (false: everything was taken, so something buffered without bound).
pub async fn flood<W: AsyncWrite + Unpin>(
    w: &mut W,
    unit: &[u8],
    blocked: oneshot::Sender<()>,
) -> bool {
    let mut blocked = Some(blocked);
    for _ in 0..4096 {
        match tokio::time::timeout(Duration::from_millis(200), w.write_all(unit)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return true,
            Err(_) => {
                if let Some(tx) = blocked.take() {
                    let _ = tx.send(());
                }
                // Keep trying: the write either goes through or fails once the tunnel is
                // closed.
                if w.write_all(unit).await.is_err() {
                    return true;
                }
            }
        }
    }
    false
}
