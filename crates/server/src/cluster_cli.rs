//! `spate cluster ...`: cluster commands over the admin HTTP API.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use serde_json::Value;

/// Cluster commands, run against a node's HTTP listener.
#[derive(Debug, Parser)]
#[command(name = "spate cluster")]
pub struct ClusterCli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Nodes, the controller, the quorum, and per partition its leader, epoch, ISR and lag.
    /// Exits 1 while any partition is under-replicated or offline, 0 once healthy.
    Status {
        /// HTTP address of a node (repeat to merge the lag each leader reports).
        #[arg(long = "http", default_value = "127.0.0.1:9644")]
        http: Vec<String>,
        /// Print the raw JSON of the first node instead of tables.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `spate cluster <args>`; returns the process exit code.
pub fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> anyhow::Result<i32> {
    let cli = ClusterCli::parse_from(args);
    match cli.command {
        Command::Status { http, json } => status(&http, json),
    }
}

fn status(nodes: &[String], json: bool) -> anyhow::Result<i32> {
    let mut views = Vec::new();
    for addr in nodes {
        views.push(get_json(addr, "/admin/cluster")?);
    }
    let Some(first) = views.first() else {
        bail!("give at least one --http address");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(first)?);
        return Ok(if first["healthy"] == true { 0 } else { 1 });
    }
    let q = &first["quorum"];
    println!(
        "cluster {}  controller {}  quorum term {} commit {} applied {}",
        first["cluster_id"].as_str().unwrap_or("?"),
        show(&first["controller"]),
        show(&q["term"]),
        show(&q["commit_index"]),
        show(&q["applied_index"]),
    );
    println!();
    println!(
        "{:<6}{:<24}{:<24}{:<8}STATE",
        "NODE", "KAFKA", "INTER-NODE", "EPOCH"
    );
    for n in first["nodes"].as_array().into_iter().flatten() {
        let state = match (n["fenced"].as_bool(), n["shutting_down"].as_bool()) {
            (_, Some(true)) => "shutting down",
            (Some(true), _) => "fenced",
            _ => "live",
        };
        println!(
            "{:<6}{:<24}{:<24}{:<8}{}",
            show(&n["id"]),
            n["kafka"].as_str().unwrap_or("?"),
            n["inter_node"].as_str().unwrap_or("?"),
            show(&n["broker_epoch"]),
            state
        );
    }
    // Lag as each leader reports it, from whichever queried node leads the partition.
    let mut lag: BTreeMap<(String, i64), String> = BTreeMap::new();
    for v in &views {
        for p in v["partitions"].as_array().into_iter().flatten() {
            if let Some(f) = p["follower_lag"].as_object() {
                let text = f
                    .iter()
                    .map(|(id, x)| format!("{id}:{}", show(&x["lag_records"])))
                    .collect::<Vec<_>>()
                    .join(" ");
                let key = (
                    p["topic"].as_str().unwrap_or("").to_owned(),
                    p["partition"].as_i64().unwrap_or(-1),
                );
                lag.insert(key, text);
            }
        }
    }
    println!();
    println!(
        "{:<24}{:<10}{:<8}{:<7}{:<12}{:<12}LAG (follower:records)",
        "TOPIC", "PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR"
    );
    for p in first["partitions"].as_array().into_iter().flatten() {
        let topic = p["topic"].as_str().unwrap_or("?");
        let index = p["partition"].as_i64().unwrap_or(-1);
        let lag = lag
            .get(&(topic.to_owned(), index))
            .cloned()
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<24}{:<10}{:<8}{:<7}{:<12}{:<12}{}",
            topic,
            index,
            show(&p["leader"]),
            show(&p["leader_epoch"]),
            list(&p["replicas"]),
            list(&p["isr"]),
            lag
        );
    }
    println!();
    let healthy = first["healthy"] == true;
    println!(
        "{}: {} under-replicated, {} offline",
        if healthy { "healthy" } else { "NOT healthy" },
        show(&first["under_replicated_partitions"]),
        show(&first["offline_partitions"]),
    );
    Ok(if healthy { 0 } else { 1 })
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn list(v: &Value) -> String {
    v.as_array()
        .map(|a| a.iter().map(show).collect::<Vec<_>>().join(","))
        .unwrap_or_else(|| "-".into())
}

/// A GET over plain HTTP/1.1; the admin API is local, small and unauthenticated for reads.
fn get_json(addr: &str, path: &str) -> anyhow::Result<Value> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("cannot reach {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = String::new();
    s.read_to_string(&mut raw)
        .with_context(|| format!("reading the answer of {addr}"))?;
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .with_context(|| format!("{addr} did not answer HTTP"))?;
    let code = head.split_whitespace().nth(1).unwrap_or("");
    let value: Value = serde_json::from_str(body)
        .with_context(|| format!("{addr}{path} did not answer JSON: {body}"))?;
    if code != "200" {
        let msg = value["error"]["message"].as_str().unwrap_or(body);
        bail!("{addr}{path}: {code}: {msg}");
    }
    Ok(value)
}
