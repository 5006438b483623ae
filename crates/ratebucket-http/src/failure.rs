//! Maps transport errors (hyper, hyper-util, io) to the failure kinds the retry table uses.

use std::error::Error as StdError;
use std::io;

use ratebucket_rt::core::FailureKind;

/// Whether the request can have reached the server decides everything: a failure to
/// connect is safe to retry; anything after the request was sent may have been executed
/// and billed, and is ambiguous.
///
/// Walks the error's source chain: a connect error (hyper-util) or `ConnectionRefused` /
/// `AddrNotAvailable` means the server was never reached; a timeout before connecting is a
/// connect timeout; timeouts after are read timeouts; resets, broken pipes, closed and
/// incomplete messages are resets after send. Anything unrecognised is treated as a reset
/// after send: ambiguous, never silently re-sent.
pub fn failure_kind(error: &(dyn StdError + 'static)) -> FailureKind {
    #[cfg_attr(not(feature = "tokio"), allow(unused_mut))]
    let mut connecting = false;
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        #[cfg(feature = "tokio")]
        if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>()
            && e.is_connect()
        {
            connecting = true;
        }
        if let Some(e) = e.downcast_ref::<hyper::Error>() {
            if e.is_timeout() {
                return FailureKind::ReadTimeout;
            }
            if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
                return FailureKind::ResetAfterSend;
            }
        }
        if let Some(e) = e.downcast_ref::<io::Error>() {
            match e.kind() {
                io::ErrorKind::ConnectionRefused | io::ErrorKind::AddrNotAvailable => {
                    return FailureKind::ConnectRefused;
                }
                io::ErrorKind::TimedOut if connecting => return FailureKind::ConnectTimeout,
                io::ErrorKind::TimedOut => return FailureKind::ReadTimeout,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof => return FailureKind::ResetAfterSend,
                _ => {}
            }
        }
        current = e.source();
    }
    if connecting { FailureKind::ConnectRefused } else { FailureKind::ResetAfterSend }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_by_whether_the_server_was_reached() {
        let kind = |k| failure_kind(&io::Error::from(k));
        assert_eq!(kind(io::ErrorKind::ConnectionRefused), FailureKind::ConnectRefused);
        assert_eq!(kind(io::ErrorKind::TimedOut), FailureKind::ReadTimeout);
        assert_eq!(kind(io::ErrorKind::ConnectionReset), FailureKind::ResetAfterSend);
        assert_eq!(kind(io::ErrorKind::BrokenPipe), FailureKind::ResetAfterSend);
        assert_eq!(kind(io::ErrorKind::Other), FailureKind::ResetAfterSend);
    }

    #[test]
    fn the_cause_is_found_down_the_source_chain() {
        #[derive(Debug)]
        struct Wrapper(io::Error);
        impl std::fmt::Display for Wrapper {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("wrapped")
            }
        }
        impl StdError for Wrapper {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let wrapped = Wrapper(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(failure_kind(&wrapped), FailureKind::ConnectRefused);
    }
}
