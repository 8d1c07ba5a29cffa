//! Round-trip mode: producers and consumers run together; latency is the send timestamp in
//! each message's header to the moment a consumer sees it.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::client;
use crate::config::RunConfig;
use crate::consumer::{spread, ConsumerPlan};
use crate::error::{BenchError, Result};
use crate::payload::MessageFactory;
use crate::report::RunReport;
use crate::runner::{
    finish_validation, merge_acks, producer_plans, run_measured_phase, summarize_consume,
    summarize_produce, validation_policy, PhaseSpec, Supervisor,
};
use crate::validate::Validator;

/// Consumers outlive the producers by at most this much beyond the configured timeout.
const DRAIN_SLACK: Duration = Duration::from_secs(10);

/// Runs the round-trip mode and fills `report`.
pub fn run(
    cfg: &RunConfig,
    sup: &mut Supervisor,
    stop: &AtomicBool,
    factory: &Arc<MessageFactory>,
    partitions: &[i32],
    report: &mut RunReport,
) -> Result<()> {
    // Start reading exactly at the current end: everything after it is this run's data.
    let md = client::metadata_client(cfg)?;
    let wm = client::watermarks(&md, &cfg.topic, partitions, cfg.timeout)?;
    let starts: Vec<(i32, i64)> = wm.iter().map(|&(p, _, hi)| (p, hi)).collect();
    let consumers_n = cfg.concurrency.min(starts.len()).max(1);
    let validator = cfg.validate.then(|| {
        Arc::new(Mutex::new(Validator::new(
            validation_policy(cfg),
            Arc::clone(factory),
        )))
    });
    let measure_from_ns = cfg.warmup.as_nanos() as u64;
    let hard_end = cfg.measured_limit().map(|d| d + cfg.timeout + DRAIN_SLACK);
    let consumers = spread(&starts, consumers_n)
        .into_iter()
        .map(|assignment| ConsumerPlan {
            assignment,
            end_offsets: None,
            measure_from_ns,
            deadline: hard_end,
            target_total: None,
        })
        .collect();
    let spec = PhaseSpec {
        name: "round-trip",
        producers: producer_plans(
            cfg.concurrency,
            cfg.message_count,
            cfg.rate_limit,
            cfg.warmup,
            cfg.measured_limit(),
        ),
        consumers,
        track_acks: cfg.validate,
        validator: validator.clone(),
        record_latency: true,
        drain: true,
    };
    let res = run_measured_phase(cfg, sup, spec, factory, stop, report)?;
    report.produce = Some(summarize_produce(&res.produce, measure_from_ns));
    report.consume = Some(summarize_consume(&res.consume, measure_from_ns, false));
    if let Some(reason) = res.abort {
        return Err(BenchError::AllRejected {
            reason,
            failed: res.produce.iter().map(|p| p.failed + p.warmup_failed).sum(),
        });
    }
    if res.idle_stopped {
        report
            .notes
            .push("consumers stopped before catching up with every delivered message".into());
    }
    if let Some(v) = validator {
        merge_acks(&v, &res.produce);
        report.validation = finish_validation(v);
    }
    Ok(())
}
