//! Which TCP ports a process listens on, read from `/proc` (Linux): the evidence behind
//! "this engine has no open port" in `arcane status` and in the tests.
//!
//! A listening socket is a line in `/proc/net/tcp` or `/proc/net/tcp6` in state `0A`
//! (`TCP_LISTEN`); it belongs to a process when one of the process's descriptors links
//! to `socket:[<inode>]` with that line's inode.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The TCP addresses `pid` listens on (IPv4 and IPv6), sorted. A process whose
/// descriptors cannot be read (gone, or another user's) is an error.
pub fn tcp_listeners(pid: u32) -> io::Result<Vec<SocketAddr>> {
    let inodes = socket_inodes(pid)?;
    let mut found = Vec::new();
    for (table, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            if let Some((address, inode)) = listening(line, v6) {
                if inodes.contains(&inode) {
                    found.push(address);
                }
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Whether a connection to `address` reaches `pid` and nothing else: at least one
/// listening socket that accepts it (bound to that address, or to the wildcard of
/// either family on its port) is `pid`'s, and every such socket is. What a client
/// checks before it sends a secret to a recorded process's port: a pid reused by
/// another user's program, or another program on the port, fails it. A process whose
/// descriptors cannot be read (gone, or another user's) is an error.
pub fn sole_listener(pid: u32, address: SocketAddr) -> io::Result<bool> {
    let inodes = socket_inodes(pid)?;
    let mut ours = false;
    for (table, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let Some((local, inode)) = listening(line, v6) else {
                continue;
            };
            let accepts = local.port() == address.port()
                && (local.ip() == address.ip() || local.ip().is_unspecified());
            if !accepts {
                continue;
            }
            if !inodes.contains(&inode) {
                return Ok(false);
            }
            ours = true;
        }
    }
    Ok(ours)
}

/// The socket inodes among `pid`'s open descriptors.
fn socket_inodes(pid: u32) -> io::Result<HashSet<u64>> {
    let mut inodes = HashSet::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        if let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|rest| rest.strip_suffix(']'))
            .and_then(|n| n.parse().ok())
        {
            inodes.insert(inode);
        }
    }
    Ok(inodes)
}

/// A `/proc/net/tcp[6]` line in the listening state: its local address and inode.
fn listening(line: &str, v6: bool) -> Option<(SocketAddr, u64)> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
    if *state != "0A" {
        return None;
    }
    let (host, port) = local.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = if v6 { ipv6(host)? } else { ipv4(host)? };
    Some((SocketAddr::new(ip, port), inode.parse().ok()?))
}

/// `0100007F` → `127.0.0.1` (the kernel prints the address in host byte order).
fn ipv4(hex: &str) -> Option<IpAddr> {
    let raw = u32::from_str_radix(hex, 16).ok()?;
    Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(raw.to_le()))))
}

/// Four host-order 32-bit words, as the kernel prints an IPv6 address.
fn ipv6(hex: &str) -> Option<IpAddr> {
    if hex.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for word in 0..4 {
        let raw = u32::from_str_radix(&hex[word * 8..word * 8 + 8], 16).ok()?;
        bytes[word * 4..word * 4 + 4].copy_from_slice(&raw.to_le_bytes());
    }
    Some(IpAddr::V6(Ipv6Addr::from(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_this_process_listeners_and_only_them() {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let v6 = std::net::TcpListener::bind("[::1]:0").ok();
        // A connected (not listening) socket is not a listener.
        let client = std::net::TcpStream::connect(v4.local_addr().unwrap()).unwrap();
        let found = tcp_listeners(std::process::id()).unwrap();
        assert!(found.contains(&v4.local_addr().unwrap()), "{found:?}");
        if let Some(v6) = &v6 {
            assert!(found.contains(&v6.local_addr().unwrap()), "{found:?}");
        }
        assert!(!found.contains(&client.local_addr().unwrap()));
        let port = v4.local_addr().unwrap().port();
        drop(v4);
        let after = tcp_listeners(std::process::id()).unwrap();
        assert!(!after.iter().any(|a| a.port() == port), "{after:?}");
    }

    #[test]
    fn the_sole_listener_is_the_process_that_holds_the_only_socket_on_the_address() {
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = v4.local_addr().unwrap();
        assert!(sole_listener(std::process::id(), address).unwrap());
        // Another process (pid 1) does not hold it; nobody listens on a closed port.
        assert!(matches!(sole_listener(1, address), Ok(false) | Err(_)));
        drop(v4);
        assert!(!sole_listener(std::process::id(), address).unwrap());
    }

    #[test]
    fn parses_the_kernels_address_forms() {
        assert_eq!(ipv4("0100007F"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(
            ipv6("00000000000000000000000001000000"),
            Some("::1".parse().unwrap())
        );
    }
}
