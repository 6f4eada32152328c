//! Stopping `streamtable run` between invocations: by a signal, or by the run itself when a
//! batch fails for good (the other topics' retries end at their next attempt).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A handle that stops a run between invocations (SIGINT/SIGTERM).
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// Asks the run to stop after the invocation in flight.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub(crate) fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// A handle set by SIGINT or SIGTERM; a second signal aborts (exit 130).
    pub fn on_signals() -> Stop {
        let stop = Stop::default();
        let s = stop.clone();
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            for n in 0..2 {
                #[cfg(unix)]
                match term.as_mut() {
                    Some(t) => {
                        tokio::select! {
                            _ = tokio::signal::ctrl_c() => {}
                            _ = t.recv() => {}
                        }
                    }
                    None => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
                #[cfg(not(unix))]
                let _ = tokio::signal::ctrl_c().await;
                if n == 0 {
                    eprintln!("stopping after the batches in flight (a second signal aborts)");
                    s.stop();
                }
            }
            std::process::exit(130);
        });
        stop
    }
}
