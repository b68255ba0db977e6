//! Bridge benchmark (`cargo bench -p arcane-front-door --bench bridge`): what joining a
//! running host costs a process. The same `system.ping` round trip, interleaved:
//!
//! 1. a named HTTP client straight to the host (`POST /v1/rpc` with
//!    `X-Arcane-Client`, keep-alive): the baseline;
//! 2. through a [`RemoteHost`] (what `arcane core --stdio` becomes next to a running
//!    `serve`): the same `POST`, answered with the response's copy on the client's
//!    event stream.
//!
//! Prints p50/p99 of each, the added latency at p50 and the ratio; both run in this
//! one process, so only the relay's own work differs.
#![allow(clippy::print_stdout, clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use arcane_core::bridge::RemoteHost;
use arcane_core::dispatch::{self, Client, Dispatch};
use arcane_core::endpoint::EndpointRecord;
use arcane_core::protocol::Request;
use arcane_core::{AppInfo, Host};
use arcane_front_door::http::{engine_client, full, Deadlines, HttpOptions};
use http_body_util::BodyExt;
use serde_json::json;

const ROUNDS: usize = 10;
const PER_ROUND: usize = 200;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ping(id: usize) -> Request {
    Request {
        id: format!("p{id}"),
        method: "system.ping".into(),
        parameters: json!({}),
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let host = Host::builder(AppInfo::default()).build();
        host.start();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let token = arcane_core::endpoint::new_token().unwrap();
        tokio::spawn(arcane_front_door::http::serve(
            host.clone(),
            listener,
            HttpOptions::new(token.clone()),
        ));
        let record = EndpointRecord {
            protocol: "arcane/1".into(),
            url: format!("http://{address}"),
            host: address.ip().to_string(),
            port: address.port(),
            pid: std::process::id(),
            token: token.clone(),
            started_at: arcane_report::time::now_rfc3339(),
            serving: Default::default(),
        };
        let remote = Arc::new(
            RemoteHost::connect(record.clone(), "bench-bridge".into())
                .await
                .expect("the bridge connects"),
        );
        let session = remote.open(Client::Private("bench"));
        let client = engine_client();
        let url = format!("{}/v1/rpc", record.url);
        let direct = |id: usize| {
            let body = ping(id).to_frame().to_string();
            let request = hyper::Request::post(&url)
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {token}"))
                .header("x-arcane-client", "bench-direct")
                .body(full(body))
                .unwrap();
            let client = &client;
            async move {
                let started = Instant::now();
                let response = client
                    .send(request, Deadlines::QUICK, arcane_core::Peer::Host)
                    .await
                    .expect("the host answers");
                let _ = response.into_body().collect().await.unwrap();
                started.elapsed()
            }
        };
        // Warm both paths.
        for id in 0..50 {
            direct(id).await;
            dispatch::call(&session, ping(id)).await;
        }
        let (mut straight, mut bridged) = (Vec::new(), Vec::new());
        let mut ratios = Vec::new();
        for round in 0..ROUNDS {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for n in 0..PER_ROUND {
                let id = round * PER_ROUND + n;
                a.push(direct(id).await);
                let started = Instant::now();
                let answer = dispatch::call(&session, ping(id)).await;
                assert!(answer.is_ok());
                b.push(started.elapsed());
            }
            ratios.push(ms(percentile(&mut b, 0.5)) / ms(percentile(&mut a, 0.5)));
            straight.extend(a);
            bridged.extend(b);
        }
        let (d50, d99) = (
            percentile(&mut straight, 0.5),
            percentile(&mut straight, 0.99),
        );
        let (b50, b99) = (
            percentile(&mut bridged, 0.5),
            percentile(&mut bridged, 0.99),
        );
        ratios.sort_by(f64::total_cmp);
        println!(
            "system.ping, {} round trips each way, interleaved",
            ROUNDS * PER_ROUND
        );
        println!(
            "  named HTTP client: p50 {:.3} ms  p99 {:.3} ms",
            ms(d50),
            ms(d99)
        );
        println!(
            "  through a bridge:  p50 {:.3} ms  p99 {:.3} ms",
            ms(b50),
            ms(b99)
        );
        println!(
            "  added at p50: {:+.3} ms; median ratio of {ROUNDS} rounds: {:.3}x",
            ms(b50) - ms(d50),
            ratios[ratios.len() / 2]
        );
        host.close().await.unwrap();
    });
}
