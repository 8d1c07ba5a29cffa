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
    /// Add a node to the cluster: its process must already run with this --node-id and
    /// --cluster-listen address. It joins the metadata quorum as a voter and becomes eligible
    /// for replicas (move some onto it with `reassign` or `balance`).
    AddNode {
        /// HTTP address of any node of the cluster.
        #[arg(long, default_value = "127.0.0.1:9644")]
        http: String,
        /// The new node's id.
        #[arg(long)]
        node_id: u64,
        /// The new node's inter-node address (its --cluster-listen), host:port.
        #[arg(long)]
        addr: String,
        /// Print JSON instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Empty a node and remove it: its replicas move to the other nodes, then it leaves the
    /// quorum. Refused when the rest could not hold its replicas or keep a quorum majority.
    Decommission {
        /// HTTP address of any node of the cluster.
        #[arg(long, default_value = "127.0.0.1:9644")]
        http: String,
        /// The node to remove.
        node_id: i32,
        /// Stop a decommissioning in progress instead (moves already done stay).
        #[arg(long)]
        cancel: bool,
        /// Wait until the node holds no replica and has left the cluster.
        #[arg(long)]
        wait: bool,
        /// Longest --wait waits, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Print JSON instead of a sentence.
        #[arg(long)]
        json: bool,
    },
    /// Move partitions: `plan` proposes new replica lists, `execute` starts a plan (the
    /// JSON format of kafka-reassign-partitions), `status` lists the moves in progress.
    Reassign {
        #[command(subcommand)]
        action: ReassignAction,
    },
    /// Move leadership back to each partition's preferred (first) replica, or with
    /// --unclean let an out-of-sync replica lead a partition with no live in-sync one.
    ElectLeaders {
        /// HTTP address of any node of the cluster.
        #[arg(long, default_value = "127.0.0.1:9644")]
        http: String,
        /// Unclean election: may lose the records only the missing replicas had.
        #[arg(long)]
        unclean: bool,
        /// Only these partitions, as topic:partition (repeatable); default every partition.
        #[arg(long = "partition")]
        partitions: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Spread replicas and preferred leaderships evenly over the nodes (after adding one).
    Balance {
        /// HTTP address of any node of the cluster.
        #[arg(long, default_value = "127.0.0.1:9644")]
        http: String,
        /// Only print the moves.
        #[arg(long)]
        dry_run: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ReassignAction {
    /// Print a plan (JSON) moving the given topics' partitions onto the given brokers with
    /// the fewest moves, keeping each topic's replication factor.
    Plan {
        /// HTTP address of any node of the cluster.
        #[arg(long, default_value = "127.0.0.1:9644")]
        http: String,
        /// Topics to move (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
        /// Brokers the replicas may be on (comma-separated ids).
        #[arg(long, value_delimiter = ',', required = true)]
        brokers: Vec<i32>,
    },
    /// Start the moves of a plan file (`-` for stdin).
    Execute {
        /// HTTP address of any node of the cluster.
        #[arg(long, default_value = "127.0.0.1:9644")]
        http: String,
        /// The plan.
        plan: String,
        /// Wait until every move has completed.
        #[arg(long)]
        wait: bool,
        /// Longest --wait waits, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The moves in progress.
    Status {
        /// HTTP address of any node of the cluster.
        #[arg(long, default_value = "127.0.0.1:9644")]
        http: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `spate cluster <args>`; returns the process exit code.
pub fn run(args: impl IntoIterator<Item = std::ffi::OsString>) -> anyhow::Result<i32> {
    let cli = ClusterCli::parse_from(args);
    match cli.command {
        Command::Status { http, json } => status(&http, json),
        Command::AddNode {
            http,
            node_id,
            addr,
            json,
        } => {
            let body = serde_json::json!({ "node_id": node_id, "addr": addr });
            let v = post_json(&http, "/admin/cluster/nodes", &body)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("node {node_id} ({addr}) is now a voter of the cluster; move replicas onto it with `spate cluster balance` or `spate cluster reassign`");
            }
            Ok(0)
        }
        Command::Decommission {
            http,
            node_id,
            cancel,
            wait,
            timeout,
            json,
        } => decommission(&http, node_id, cancel, wait, timeout, json),
        Command::Reassign { action } => match action {
            ReassignAction::Plan {
                http,
                topics,
                brokers,
            } => {
                let state = get_json(&http, "/admin/cluster")?;
                let plan = plan_moves(&state, &topics, &brokers)?;
                println!("{}", serde_json::to_string_pretty(&plan)?);
                Ok(0)
            }
            ReassignAction::Execute {
                http,
                plan,
                wait,
                timeout,
                json,
            } => {
                let text = if plan == "-" {
                    let mut s = String::new();
                    std::io::stdin().read_to_string(&mut s)?;
                    s
                } else {
                    std::fs::read_to_string(&plan)
                        .with_context(|| format!("cannot read plan file {plan}"))?
                };
                let body: Value =
                    serde_json::from_str(&text).with_context(|| format!("{plan} is not JSON"))?;
                let v = post_json(&http, "/admin/cluster/reassignments", &body)?;
                let code = print_outcomes(&v, json)?;
                if code == 0 && wait {
                    wait_until(&http, timeout, "every move has completed", |s| {
                        s["reassigning_partitions"].as_u64() == Some(0)
                    })?;
                }
                Ok(code)
            }
            ReassignAction::Status { http, json } => {
                let v = get_json(&http, "/admin/cluster/reassignments")?;
                if json {
                    println!("{}", serde_json::to_string_pretty(&v)?);
                    return Ok(0);
                }
                let moves = v["reassignments"].as_array().cloned().unwrap_or_default();
                if moves.is_empty() {
                    println!("no reassignment in progress");
                    return Ok(0);
                }
                println!(
                    "{:<24}{:<10}{:<14}{:<14}{:<10}{:<10}ISR",
                    "TOPIC", "PARTITION", "REPLICAS", "TARGET", "ADDING", "REMOVING"
                );
                for m in moves {
                    println!(
                        "{:<24}{:<10}{:<14}{:<14}{:<10}{:<10}{}",
                        m["topic"].as_str().unwrap_or("?"),
                        show(&m["partition"]),
                        list(&m["replicas"]),
                        list(&m["target"]),
                        list(&m["adding"]),
                        list(&m["removing"]),
                        list(&m["isr"])
                    );
                }
                Ok(0)
            }
        },
        Command::ElectLeaders {
            http,
            unclean,
            partitions,
            json,
        } => {
            let mut body = serde_json::json!({
                "type": if unclean { "unclean" } else { "preferred" },
            });
            if !partitions.is_empty() {
                let mut list = Vec::new();
                for tp in &partitions {
                    let (t, p) = tp
                        .rsplit_once(':')
                        .and_then(|(t, p)| Some((t, p.parse::<i32>().ok()?)))
                        .with_context(|| format!("--partition {tp:?} is not topic:partition"))?;
                    list.push(serde_json::json!({"topic": t, "partition": p}));
                }
                body["partitions"] = Value::Array(list);
            }
            let v = post_json(&http, "/admin/cluster/elect-leaders", &body)?;
            print_outcomes(&v, json)
        }
        Command::Balance {
            http,
            dry_run,
            json,
        } => {
            if dry_run {
                let plan = get_json(&http, "/admin/cluster/balance")?;
                println!("{}", serde_json::to_string_pretty(&plan)?);
                return Ok(0);
            }
            let v = post_json(&http, "/admin/cluster/balance", &Value::Null)?;
            print_outcomes(&v, json)
        }
    }
}

fn decommission(
    http: &str,
    node_id: i32,
    cancel: bool,
    wait: bool,
    timeout: u64,
    json: bool,
) -> anyhow::Result<i32> {
    let path = format!(
        "/admin/cluster/nodes/{node_id}/decommission{}",
        if cancel { "?cancel=true" } else { "" }
    );
    let v = post_json(http, &path, &Value::Null)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if cancel {
        println!("node {node_id}: decommissioning stopped");
    } else {
        println!("node {node_id}: decommissioning; its replicas are moving to the other nodes");
    }
    if wait && !cancel {
        wait_until(http, timeout, &format!("node {node_id} has left"), |s| {
            !s["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|n| n["id"].as_i64() == Some(i64::from(node_id)))
        })?;
    }
    Ok(0)
}

/// Polls the cluster status until `done` holds, printing progress.
fn wait_until(
    http: &str,
    timeout: u64,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(timeout);
    loop {
        let s = get_json(http, "/admin/cluster")?;
        if done(&s) {
            println!("done: {what}");
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("gave up after {timeout} s waiting until {what}");
        }
        eprintln!(
            "waiting until {what}: {} partitions moving, {} under-replicated",
            show(&s["reassigning_partitions"]),
            show(&s["under_replicated_partitions"])
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Prints per-partition outcomes of a change; exit code 1 when any failed.
fn print_outcomes(v: &Value, json: bool) -> anyhow::Result<i32> {
    let failed = v["failed"].as_u64().unwrap_or(0);
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        for p in v["partitions"].as_array().into_iter().flatten() {
            let what = if p["ok"] == true {
                match (&p["replicas"], &p["leader"]) {
                    (r @ Value::Array(_), _) => format!("moving to {}", list(r)),
                    (_, l) if !l.is_null() => format!("leader {}", show(l)),
                    _ => "ok".to_owned(),
                }
            } else {
                format!("FAILED: {}", p["error"].as_str().unwrap_or("?"))
            };
            println!(
                "{}-{}: {what}",
                p["topic"].as_str().unwrap_or("?"),
                show(&p["partition"])
            );
        }
        if let Some(note) = v["note"].as_str() {
            println!("{note}");
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// New replica lists for `topics` on `brokers` with the fewest moves: replicas already on an
/// allowed broker stay, the rest go to the allowed brokers holding the fewest replicas.
fn plan_moves(state: &Value, topics: &[String], brokers: &[i32]) -> anyhow::Result<Value> {
    let known: Vec<i64> = state["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["id"].as_i64())
        .collect();
    if let Some(b) = brokers.iter().find(|b| !known.contains(&i64::from(**b))) {
        bail!("broker {b} is not a node of the cluster (nodes: {known:?})");
    }
    let mut load: BTreeMap<i32, usize> = brokers.iter().map(|&b| (b, 0)).collect();
    let partitions: Vec<&Value> = state["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    for p in &partitions {
        for r in p["replicas"].as_array().into_iter().flatten() {
            if let Some(n) = r.as_i64().and_then(|r| load.get_mut(&(r as i32))) {
                *n += 1;
            }
        }
    }
    let mut moves = Vec::new();
    for t in topics {
        let mine: Vec<&&Value> = partitions
            .iter()
            .filter(|p| p["topic"] == t.as_str())
            .collect();
        if mine.is_empty() {
            bail!("topic {t:?} does not exist");
        }
        for p in mine {
            let current: Vec<i32> = p["replicas"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r.as_i64().map(|r| r as i32))
                .collect();
            if brokers.len() < current.len() {
                bail!(
                    "{t} has replication factor {} but only {} brokers were given",
                    current.len(),
                    brokers.len()
                );
            }
            let mut target: Vec<i32> = Vec::with_capacity(current.len());
            for &r in &current {
                if load.contains_key(&r) {
                    target.push(r);
                } else {
                    let pick = load
                        .iter()
                        .filter(|(b, _)| !current.contains(b) && !target.contains(b))
                        .min_by_key(|(&b, &n)| (n, b))
                        .map(|(&b, _)| b)
                        .context("not enough brokers to place every replica")?;
                    *load.entry(pick).or_default() += 1;
                    target.push(pick);
                }
            }
            if target != current {
                moves.push(serde_json::json!({
                    "topic": t,
                    "partition": p["partition"],
                    "replicas": target,
                }));
            }
        }
    }
    Ok(serde_json::json!({ "version": 1, "partitions": moves }))
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

/// A GET over plain HTTP/1.1; the admin API is local and small.
fn get_json(addr: &str, path: &str) -> anyhow::Result<Value> {
    request(addr, "GET", path, "")
}

/// A POST of a JSON body (nothing for `null`) over plain HTTP/1.1.
fn post_json(addr: &str, path: &str, body: &Value) -> anyhow::Result<Value> {
    let payload = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    request(addr, "POST", path, &payload)
}

fn request(addr: &str, method: &str, path: &str, payload: &str) -> anyhow::Result<Value> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("cannot reach {addr}"))?;
    // A node being added catches up before the answer: give it time.
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let token = std::env::var("SPATE_HTTP_TOKEN").ok();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        payload.len()
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
    if code != "200" && code != "207" {
        let msg = value["error"]["message"].as_str().unwrap_or(body);
        bail!("{msg}");
    }
    Ok(value)
}
