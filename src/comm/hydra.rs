//! MPICH's hydra launcher (`mpiexec`/`mpirun`), told that a rank finalized when MPI_Finalize
//! itself could not: the one place reshard speaks a launcher's own protocol.
//!
//! Why: MPICH 4.0.x over UCX's tcp transport can hang in MPI_Finalize after all the work is done
//! (docs/performance.md, "MPI_Finalize over UCX tcp"). The finalize deadline then ends the rank without
//! MPI_Finalize, and hydra takes a rank whose PMI connection closes without PMI's `finalize` for a
//! failed one: its proxy records exit status 1 for it and, by default, kills the other ranks of its
//! node (`pmi_cb` in hydra's `pm/pmiserv/pmip_cb.c`, MPICH 4.0.2). So before such a rank exits it
//! sends the `finalize` that MPI_Finalize would have sent.
//!
//! The wire protocol (MPICH 4.0.2, `src/pm/hydra/pm/pmiserv/`):
//! - Each rank inherits one end of a `socketpair(AF_UNIX, SOCK_STREAM)` whose number is in
//!   `PMI_FD` (`pmip_cb.c`, where the proxy launches ranks); `HYDI_CONTROL_FD` in the environment
//!   says hydra's proxy started the rank (`pmip.c`). Slurm's srun and other launchers set neither,
//!   so elsewhere nothing is sent.
//! - A PMI-1 command is `cmd=NAME` plus ` key=value` pairs, ended by a newline. The proxy tells
//!   PMI-1 from PMI-2 by the `cmd=` prefix of each command (`check_pmi_cmd`), so a PMI-1 command
//!   is understood whichever version the MPI library spoke before.
//! - `cmd=finalize\n` is answered with `cmd=finalize_ack\n`; the proxy then stops watching the
//!   socket and closes its end (`fn_finalize` in `pmip_pmi_v1.c`). A reply the rank's own MPI
//!   thread was still waiting for (`cmd=barrier_out` of the barrier in MPI_Finalize) may come
//!   first, so lines are read until the acknowledgement.
//!
//! The caller must have stopped the thread that was inside MPI (`sys::park_thread`): it may be
//! reading the same socket.

use std::io::{self, Read, Write};
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// What a rank sends: PMI-1's `finalize`.
pub(crate) const FINALIZE: &[u8] = b"cmd=finalize\n";
/// The proxy's answer to [`FINALIZE`], without its newline.
pub(crate) const FINALIZE_ACK: &[u8] = b"cmd=finalize_ack";
/// How long a rank waits for the acknowledgement: the proxy answers at once unless it is gone.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// A PMI-1 line is at most 1024 bytes (`PMIU_MAXLINE`); a longer one is not the proxy talking.
const MAX_LINE: usize = 1024;

/// The PMI socket hydra gave this rank, if hydra started it: `PMI_FD` with `HYDI_CONTROL_FD`.
pub(crate) fn pmi_fd(env: impl Fn(&str) -> Option<String>) -> Option<RawFd> {
    env("HYDI_CONTROL_FD")?;
    env("PMI_FD")?
        .trim()
        .parse::<RawFd>()
        .ok()
        .filter(|&fd| fd >= 0)
}

/// Under hydra, tells the launcher that this rank finalized and waits (at most [`ACK_WAIT`]) for
/// its acknowledgement, so that the connection closes only after the launcher took it. Returns
/// whether hydra acknowledged; does nothing (and returns false) under any other launcher.
pub(crate) fn tell_finalized() -> bool {
    let Some(fd) = pmi_fd(|k| std::env::var(k).ok()) else {
        return false;
    };
    // `PMI_FD` is the rank's end of hydra's socketpair, open for the life of the process (MPICH's
    // PMI client never closes it before MPI_Finalize returns, and the thread in MPI is parked);
    // it stays MPI's, never closed here.
    let mut proxy = crate::sys::borrow_unix_stream(fd);
    finalize_over(&mut proxy, ACK_WAIT).is_ok()
}

/// Sends [`FINALIZE`] over `proxy` and reads lines until [`FINALIZE_ACK`], for at most `wait`.
///
/// # Errors
/// The write failed, the socket closed, a line was too long, or no acknowledgement came in time.
pub(crate) fn finalize_over(proxy: &mut UnixStream, wait: Duration) -> io::Result<()> {
    let until = Instant::now() + wait;
    proxy.write_all(FINALIZE)?;
    let mut line = Vec::new();
    let mut byte = [0u8];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        proxy.set_read_timeout(Some(left))?;
        if proxy.read(&mut byte)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        match byte[0] {
            b'\n' if line == FINALIZE_ACK => return Ok(()),
            b'\n' => line.clear(),
            _ if line.len() >= MAX_LINE => return Err(io::ErrorKind::InvalidData.into()),
            b => line.push(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())
    }

    #[test]
    fn only_hydra_ranks_have_a_pmi_socket() {
        let hydra = [("PMI_FD", " 7\n"), ("HYDI_CONTROL_FD", "5")];
        assert_eq!(pmi_fd(env(&hydra)), Some(7));
        // srun's PMI sets PMI_FD too, but no hydra control socket.
        assert_eq!(pmi_fd(env(&[("PMI_FD", "7")])), None);
        assert_eq!(pmi_fd(env(&[("HYDI_CONTROL_FD", "5")])), None);
        for bad in ["", "x", "-1"] {
            let vars = [("PMI_FD", bad), ("HYDI_CONTROL_FD", "5")];
            assert_eq!(pmi_fd(env(&vars)), None, "{bad:?}");
        }
    }

    /// The other end of the socket, answering as hydra's proxy does; returns what it read.
    fn proxy(replies: &'static [u8]) -> (UnixStream, std::thread::JoinHandle<Vec<u8>>) {
        let (rank, mut proxy) = UnixStream::pair().unwrap();
        let seen = std::thread::spawn(move || {
            let mut got = vec![0u8; FINALIZE.len()];
            proxy.read_exact(&mut got).unwrap();
            proxy.write_all(replies).unwrap();
            got
        });
        (rank, seen)
    }

    #[test]
    fn finalize_is_acknowledged_after_a_pending_barrier_reply() {
        let (mut rank, seen) = proxy(b"cmd=barrier_out\ncmd=finalize_ack\n");
        finalize_over(&mut rank, Duration::from_secs(60)).unwrap();
        assert_eq!(seen.join().unwrap(), FINALIZE);
    }

    #[test]
    fn a_proxy_that_closes_or_answers_otherwise_is_no_acknowledgement() {
        // The proxy's end closes once it answered.
        let (mut rank, seen) = proxy(b"cmd=finalize_ack_not\n");
        let err = finalize_over(&mut rank, Duration::from_secs(60)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(seen.join().unwrap(), FINALIZE);
    }

    #[test]
    fn a_silent_proxy_is_waited_for_no_longer_than_asked() {
        let (mut rank, _proxy) = UnixStream::pair().unwrap();
        let err = finalize_over(&mut rank, Duration::from_millis(50)).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{err}"
        );
    }
}
