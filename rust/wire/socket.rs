//! Frames over a Unix stream socket, descriptors passed with `SCM_RIGHTS`.

use std::ffi::c_void;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use super::frame::{read_frame, Frame, FrameHeader, Transport, HEADER_BYTES, MAX_FDS};
use super::WireError;

/// One end of a connection to (or from) a worker process. Owns its socket:
/// [`WireSocket::shutdown`] wakes every thread waiting on it and tells the
/// other end, which sees the end of the stream; the descriptor closes when
/// the socket is dropped, once nothing can be using it.
#[derive(Debug)]
pub struct WireSocket {
    fd: OwnedFd,
}

/// A control-message buffer for `count` descriptors, aligned as `cmsghdr` needs.
fn control_space(count: usize) -> Vec<u64> {
    // SAFETY: CMSG_SPACE only computes a size from its argument.
    let bytes = unsafe { libc::CMSG_SPACE((count * size_of::<libc::c_int>()) as u32) } as usize;
    vec![0u64; bytes.div_ceil(size_of::<u64>())]
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

impl WireSocket {
    /// Takes ownership of `fd`, a connected Unix stream socket, and makes
    /// it blocking (a Python socket given a timeout was not).
    pub fn new(fd: OwnedFd) -> Result<Self, WireError> {
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl on a descriptor this value owns; F_GETFL/F_SETFL
        // read and write its status flags only.
        unsafe {
            let flags = libc::fcntl(raw, libc::F_GETFL);
            if flags < 0 || libc::fcntl(raw, libc::F_SETFL, flags & !libc::O_NONBLOCK) < 0 {
                return Err(last_error().into());
            }
        }
        Ok(WireSocket { fd })
    }

    pub fn fileno(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Ends the connection both ways: a thread blocked on it returns, the
    /// other end reads the end of the stream. Harmless when done already.
    pub fn shutdown(&self) {
        // SAFETY: shutdown on a descriptor this value owns; it is not closed.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Sends one frame: `payload`, with `fds` (the other end gets copies).
    pub fn send(&self, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), WireError> {
        if fds.len() > MAX_FDS {
            return Err(WireError::TooManyFds {
                count: fds.len() as u32,
            });
        }
        let header = FrameHeader {
            fds: fds.len() as u32,
            length: payload.len() as u64,
        }
        .encode();
        let mut iov = [
            libc::iovec {
                iov_base: header.as_ptr() as *mut c_void,
                iov_len: HEADER_BYTES,
            },
            libc::iovec {
                iov_base: payload.as_ptr() as *mut c_void,
                iov_len: payload.len(),
            },
        ];
        let mut control = control_space(fds.len());
        // SAFETY: msghdr is plain data; all-zero is its empty value.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = iov.as_mut_ptr();
        message.msg_iovlen = iov.len() as _;
        if !fds.is_empty() {
            let data_bytes = fds.len() * size_of::<libc::c_int>();
            message.msg_control = control.as_mut_ptr() as *mut c_void;
            message.msg_controllen = (control.len() * size_of::<u64>()) as _;
            // SAFETY: `control` is aligned for cmsghdr and CMSG_SPACE(data_bytes)
            // long, so the first header and its data lie inside it; the
            // descriptors are copied unaligned, as CMSG_DATA allows.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&message);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(data_bytes as u32) as _;
                let data = libc::CMSG_DATA(cmsg) as *mut libc::c_int;
                for (i, fd) in fds.iter().enumerate() {
                    std::ptr::write_unaligned(data.add(i), fd.as_raw_fd());
                }
            }
        }
        let total = HEADER_BYTES + payload.len();
        let sent = loop {
            // SAFETY: `message` points at `iov`, `header`, `payload` and
            // `control`, all alive for the call. MSG_NOSIGNAL: a peer gone
            // is an error here, not a SIGPIPE.
            let sent = unsafe { libc::sendmsg(self.fileno(), &message, libc::MSG_NOSIGNAL) };
            if sent >= 0 {
                break sent as usize;
            }
            let err = last_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err.into());
            }
        };
        // The descriptors went with the first bytes; the rest is plain bytes.
        let mut at = sent;
        while at < total {
            let rest: &[u8] = if at < HEADER_BYTES {
                &header[at..]
            } else {
                &payload[at - HEADER_BYTES..]
            };
            // SAFETY: `rest` is a live slice, its length passed with it.
            let count = unsafe {
                libc::send(
                    self.fileno(),
                    rest.as_ptr() as *const c_void,
                    rest.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if count < 0 {
                let err = last_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err.into());
            }
            at += count as usize;
        }
        Ok(())
    }

    /// Receives one frame, waiting at most `timeout` for all of it (None:
    /// for ever).
    pub fn receive(&self, timeout: Option<Duration>) -> Result<Frame, WireError> {
        let mut receiving = Receiving {
            fd: self.fileno(),
            deadline: timeout.map(|timeout| Instant::now() + timeout),
            control: control_space(MAX_FDS),
        };
        read_frame(&mut receiving)
    }
}

/// A socket being read until a deadline.
struct Receiving {
    fd: RawFd,
    deadline: Option<Instant>,
    control: Vec<u64>,
}

impl Receiving {
    /// Waits until the socket has something to read, or the deadline.
    fn wait_readable(&self) -> Result<(), WireError> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let millis = left.as_millis().min(i32::MAX as u128) as i32;
            let millis = if left.is_zero() { 0 } else { millis.max(1) };
            let mut poll = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, alive for the call.
            let ready = unsafe { libc::poll(&mut poll, 1, millis) };
            if ready > 0 {
                return Ok(());
            }
            if ready == 0 {
                if Instant::now() >= deadline {
                    return Err(WireError::TimedOut);
                }
                continue;
            }
            let err = last_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err.into());
            }
        }
    }
}

impl Transport for Receiving {
    fn receive(&mut self, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<usize, WireError> {
        loop {
            self.wait_readable()?;
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr() as *mut c_void,
                iov_len: buf.len(),
            };
            // SAFETY: msghdr is plain data; all-zero is its empty value.
            let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
            message.msg_iov = &mut iov;
            message.msg_iovlen = 1;
            message.msg_control = self.control.as_mut_ptr() as *mut c_void;
            message.msg_controllen = (self.control.len() * size_of::<u64>()) as _;
            // SAFETY: `message` points at `iov` (over `buf`) and `control`,
            // both alive and writable for the call; MSG_CMSG_CLOEXEC: the
            // descriptors received are not inherited by a process started
            // meanwhile.
            let count = unsafe { libc::recvmsg(self.fd, &mut message, libc::MSG_CMSG_CLOEXEC) };
            if count < 0 {
                let err = last_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err.into());
            }
            // SAFETY: the kernel filled `control` with `msg_controllen` bytes
            // of well-formed control messages; CMSG_FIRSTHDR/NXTHDR stay
            // inside them, and each SCM_RIGHTS message's data holds whole
            // descriptors, now this process's (owned from here on).
            unsafe {
                let mut cmsg = libc::CMSG_FIRSTHDR(&message);
                while !cmsg.is_null() {
                    if (*cmsg).cmsg_level == libc::SOL_SOCKET
                        && (*cmsg).cmsg_type == libc::SCM_RIGHTS
                    {
                        let data = libc::CMSG_DATA(cmsg) as *const libc::c_int;
                        let header = data as usize - cmsg as usize;
                        let count = ((*cmsg).cmsg_len as usize - header) / size_of::<libc::c_int>();
                        for i in 0..count {
                            fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                        }
                    }
                    cmsg = libc::CMSG_NXTHDR(&message, cmsg);
                }
            }
            if message.msg_flags & libc::MSG_CTRUNC != 0 {
                // More descriptors than any frame carries: the kernel closed the rest.
                return Err(WireError::TooManyFds {
                    count: fds.len() as u32 + 1,
                });
            }
            return Ok(count as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    fn pair() -> (WireSocket, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        (WireSocket::new(OwnedFd::from(ours)).unwrap(), theirs)
    }

    #[test]
    fn a_frame_and_its_descriptors_cross_the_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, b) = (
            WireSocket::new(OwnedFd::from(a)).unwrap(),
            WireSocket::new(OwnedFd::from(b)).unwrap(),
        );
        let (file, mut other) = UnixStream::pair().unwrap();
        a.send(b"with a descriptor", &[file.as_fd()]).unwrap();
        let frame = b.receive(Some(Duration::from_secs(10))).unwrap();
        assert_eq!(frame.payload, b"with a descriptor");
        assert_eq!(frame.fds.len(), 1);
        // The descriptor received is the same socket: what is written to it
        // arrives at `other`.
        let mut received = UnixStream::from(frame.fds.into_iter().next().unwrap());
        received.write_all(b"x").unwrap();
        let mut byte = [0u8];
        std::io::Read::read_exact(&mut other, &mut byte).unwrap();
        assert_eq!(&byte, b"x");
        let big = vec![5u8; 3 << 20];
        let sender = std::thread::spawn(move || a.send(&big, &[]).map(|()| a));
        assert_eq!(b.receive(None).unwrap().payload.len(), 3 << 20);
        drop(sender.join().unwrap().unwrap());
        assert!(matches!(b.receive(None), Err(WireError::Closed)));
    }

    #[test]
    fn waits_end_at_the_deadline_and_at_shutdown() {
        let (ours, _theirs) = pair();
        assert!(matches!(
            ours.receive(Some(Duration::from_millis(20))),
            Err(WireError::TimedOut)
        ));
        let ours = std::sync::Arc::new(ours);
        let waiting = {
            let ours = ours.clone();
            std::thread::spawn(move || ours.receive(None))
        };
        std::thread::sleep(Duration::from_millis(20));
        ours.shutdown();
        assert!(matches!(waiting.join().unwrap(), Err(WireError::Closed)));
    }

    #[test]
    fn a_peer_that_dies_mid_frame_is_a_truncated_frame() {
        let (ours, mut theirs) = pair();
        let mut bytes = FrameHeader {
            fds: 0,
            length: 100,
        }
        .encode()
        .to_vec();
        bytes.extend_from_slice(&[1; 10]);
        theirs.write_all(&bytes).unwrap();
        drop(theirs);
        assert!(matches!(
            ours.receive(None),
            Err(WireError::Truncated {
                got: 26,
                expected: 116
            })
        ));
    }
}
