use super::*;

const T: &str = "tx";

fn coordinator() -> TxnCoordinator {
    TxnCoordinator::new(TxnConfig {
        max_timeout_ms: 60_000,
        id_expiration_ms: 1_000_000,
    })
}

fn ids() -> impl FnMut() -> Result<i64, TxnError> {
    let mut next = 100;
    move || {
        next += 1;
        Ok(next)
    }
}

fn init(c: &mut TxnCoordinator, now: i64) -> (i64, i16) {
    match c
        .init_producer_id(T, 10_000, None, now, &mut ids())
        .unwrap()
    {
        InitAnswer::Ready {
            producer_id,
            producer_epoch,
            ..
        } => (producer_id, producer_epoch),
        other => panic!("{other:?}"),
    }
}

fn parts(ps: &[i32]) -> Vec<(String, i32)> {
    ps.iter().map(|p| ("t".to_string(), *p)).collect()
}

fn status(c: &TxnCoordinator) -> TxnStatus {
    c.describe(T).unwrap().status
}

#[test]
fn a_new_id_gets_a_producer_id_at_epoch_zero_and_the_next_init_bumps_the_epoch() {
    let mut c = coordinator();
    assert_eq!(init(&mut c, 0), (101, 0));
    assert_eq!(status(&c), TxnStatus::Empty);
    let (pid, epoch) = init(&mut c, 1);
    assert_eq!(
        (pid, epoch),
        (101, 1),
        "same id, next epoch: the old producer is fenced"
    );
}

#[test]
fn timeouts_over_the_maximum_or_not_positive_are_refused_and_nothing_is_kept() {
    let mut c = coordinator();
    for t in [60_001, 0, -5] {
        assert_eq!(
            c.init_producer_id(T, t, None, 0, &mut ids()),
            Err(ResponseError::InvalidTransactionTimeout)
        );
    }
    assert!(c.describe(T).is_none());
    assert_eq!(
        c.init_producer_id("", 1_000, None, 0, &mut ids()),
        Err(ResponseError::InvalidRequest)
    );
    let long = "x".repeat(MAX_TXN_ID_BYTES + 1);
    assert_eq!(
        c.init_producer_id(&long, 1_000, None, 0, &mut ids()),
        Err(ResponseError::InvalidRequest),
        "an id no record key can hold"
    );
    assert!(c.list().is_empty());
}

#[test]
fn a_full_commit_goes_ongoing_prepare_commit_complete_commit() {
    let mut c = coordinator();
    let (pid, e) = init(&mut c, 0);
    let w = c
        .add_partitions(T, pid, e, &parts(&[0, 1]), 5)
        .unwrap()
        .unwrap();
    assert_eq!(w.meta.as_ref().unwrap().status, TxnStatus::Ongoing);
    assert_eq!(w.meta.as_ref().unwrap().start_ms, 5);
    assert_eq!(
        c.add_partitions(T, pid, e, &parts(&[1]), 6).unwrap(),
        None,
        "nothing new to write"
    );
    assert!(c
        .add_partitions(T, pid, e, &parts(&[2]), 7)
        .unwrap()
        .is_some());
    assert_eq!(c.verify(T, pid, e, "t", 2), Ok(()));
    assert_eq!(
        c.verify(T, pid, e, "t", 3),
        Err(ResponseError::InvalidTxnState)
    );
    let Ended::Prepared { markers, .. } = c.end_txn(T, pid, e, true, 8, false).unwrap() else {
        panic!()
    };
    assert!(markers.commit);
    assert_eq!(markers.partitions, parts(&[0, 1, 2]));
    assert_eq!(status(&c), TxnStatus::PrepareCommit);
    assert_eq!(c.in_flight(), vec![markers.clone()]);
    assert_eq!(
        c.add_partitions(T, pid, e, &parts(&[0]), 9),
        Err(ResponseError::ConcurrentTransactions),
        "no new transaction before the markers are written"
    );
    assert_eq!(
        c.end_txn(T, pid, e, true, 9, false),
        Err(ResponseError::ConcurrentTransactions)
    );
    assert_eq!(
        c.end_txn(T, pid, e, false, 9, false),
        Err(ResponseError::InvalidTxnState)
    );
    let done = c.markers_written(T, pid, e, 10).unwrap();
    assert_eq!(
        done.meta.as_ref().unwrap().status,
        TxnStatus::CompleteCommit
    );
    assert!(done.meta.as_ref().unwrap().partitions.is_empty());
    assert_eq!(c.markers_written(T, pid, e, 11), None, "completed once");
    assert_eq!(
        c.end_txn(T, pid, e, true, 12, false),
        Ok(Ended::AlreadyDone),
        "a retried commit"
    );
    assert_eq!(
        c.end_txn(T, pid, e, false, 12, false),
        Err(ResponseError::InvalidTxnState)
    );
    // The next transaction starts afresh.
    let w = c
        .add_partitions(T, pid, e, &parts(&[5]), 20)
        .unwrap()
        .unwrap();
    assert_eq!(
        w.meta.unwrap().partitions,
        parts(&[5]).into_iter().collect()
    );
}

#[test]
fn an_abort_completes_as_complete_abort_and_end_txn_without_a_transaction_is_refused() {
    let mut c = coordinator();
    let (pid, e) = init(&mut c, 0);
    assert_eq!(
        c.end_txn(T, pid, e, true, 1, false),
        Err(ResponseError::InvalidTxnState)
    );
    c.add_partitions(T, pid, e, &parts(&[0]), 1).unwrap();
    let Ended::Prepared { markers, .. } = c.end_txn(T, pid, e, false, 2, false).unwrap() else {
        panic!()
    };
    assert!(!markers.commit);
    assert_eq!(
        c.end_txn(T, pid, e, false, 3, false),
        Err(ResponseError::ConcurrentTransactions)
    );
    c.markers_written(T, pid, e, 4).unwrap();
    assert_eq!(status(&c), TxnStatus::CompleteAbort);
    assert_eq!(
        c.end_txn(T, pid, e, false, 5, false),
        Ok(Ended::AlreadyDone)
    );
    assert_eq!(
        c.end_txn(T, pid, e, true, 5, false),
        Err(ResponseError::InvalidTxnState)
    );
}

#[test]
fn a_second_producer_fences_the_first_and_aborts_its_open_transaction() {
    let mut c = coordinator();
    let (pid, e0) = init(&mut c, 0);
    c.add_partitions(T, pid, e0, &parts(&[0]), 1).unwrap();
    let InitAnswer::Aborting { markers, write } =
        c.init_producer_id(T, 10_000, None, 2, &mut ids()).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        markers.producer_epoch,
        e0 + 1,
        "markers carry the fencing epoch"
    );
    assert!(!markers.commit);
    assert_eq!(write.meta.unwrap().status, TxnStatus::PrepareAbort);
    // The zombie is fenced on every call.
    assert_eq!(
        c.add_partitions(T, pid, e0, &parts(&[1]), 3),
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        c.end_txn(T, pid, e0, true, 3, false),
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        c.verify(T, pid, e0, "t", 0),
        Err(ResponseError::InvalidProducerEpoch),
        "a produce from the zombie"
    );
    // The new producer retries until the abort completes.
    assert_eq!(
        c.init_producer_id(T, 10_000, None, 3, &mut ids()),
        Err(ResponseError::ConcurrentTransactions)
    );
    c.markers_written(T, pid, e0 + 1, 4).unwrap();
    assert_eq!(init(&mut c, 5), (pid, e0 + 2));
}

#[test]
fn an_open_transaction_past_its_timeout_is_aborted_under_a_new_epoch() {
    let mut c = coordinator();
    let (pid, e) = init(&mut c, 0);
    c.add_partitions(T, pid, e, &parts(&[0, 1]), 1_000).unwrap();
    assert!(c.expire(11_000).0.is_empty(), "not past 10 s yet");
    let (aborts, forgotten) = c.expire(11_001);
    assert!(forgotten.is_empty());
    assert_eq!(aborts.len(), 1);
    let (write, markers) = &aborts[0];
    assert_eq!(write.meta.as_ref().unwrap().status, TxnStatus::PrepareAbort);
    assert_eq!((markers.producer_epoch, markers.commit), (e + 1, false));
    assert_eq!(markers.partitions, parts(&[0, 1]));
    assert!(c.expire(20_000).0.is_empty(), "aborted once");
    assert_eq!(
        c.end_txn(T, pid, e, true, 20_000, false),
        Err(ResponseError::ProducerFenced)
    );
}

#[test]
fn settled_ids_idle_past_the_expiration_are_forgotten_with_a_tombstone() {
    let mut c = coordinator();
    init(&mut c, 0);
    let (_, forgotten) = c.expire(999_999);
    assert!(forgotten.is_empty());
    let (_, forgotten) = c.expire(1_000_000);
    assert_eq!(
        forgotten,
        vec![Write {
            txn_id: T.into(),
            meta: None
        }]
    );
    assert!(c.describe(T).is_none());
}

#[test]
fn kip_360_a_producer_presenting_its_current_epoch_keeps_its_id_and_a_stale_one_is_fenced() {
    let mut c = coordinator();
    let (pid, e) = init(&mut c, 0);
    let InitAnswer::Ready {
        producer_id,
        producer_epoch,
        ..
    } = c
        .init_producer_id(T, 10_000, Some((pid, e)), 1, &mut ids())
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((producer_id, producer_epoch), (pid, e + 1));
    // The same request again (its answer was lost) gets the same answer.
    let again = c
        .init_producer_id(T, 10_000, Some((pid, e)), 2, &mut ids())
        .unwrap();
    assert!(matches!(again, InitAnswer::Ready { producer_epoch, .. } if producer_epoch == e + 1));
    assert_eq!(
        c.init_producer_id(T, 10_000, Some((pid, e + 7)), 3, &mut ids()),
        Err(ResponseError::ProducerFenced)
    );
    assert_eq!(
        c.init_producer_id("other", 10_000, Some((pid, e)), 3, &mut ids()),
        Err(ResponseError::InvalidProducerIdMapping)
    );
}

#[test]
fn an_exhausted_epoch_moves_to_a_new_producer_id() {
    let mut c = coordinator();
    let (pid, _) = init(&mut c, 0);
    let mut m = c.describe(T).unwrap().clone();
    m.producer_epoch = i16::MAX - 1;
    c.replay(T.into(), Some(m));
    let answer = c
        .init_producer_id(T, 10_000, None, 1, &mut || Ok(500))
        .unwrap();
    assert!(
        matches!(
            answer,
            InitAnswer::Ready {
                producer_id: 500,
                producer_epoch: 0,
                ..
            }
        ),
        "{answer:?} (was {pid})"
    );
}

#[test]
fn unknown_ids_and_wrong_producer_ids_are_refused() {
    let mut c = coordinator();
    assert_eq!(
        c.add_partitions(T, 1, 0, &parts(&[0]), 0),
        Err(ResponseError::InvalidProducerIdMapping)
    );
    let (pid, e) = init(&mut c, 0);
    assert_eq!(
        c.add_partitions(T, pid + 1, e, &parts(&[0]), 0),
        Err(ResponseError::InvalidProducerIdMapping)
    );
    assert_eq!(
        c.end_txn(T, pid + 1, e, true, 0, false),
        Err(ResponseError::InvalidProducerIdMapping)
    );
}

#[test]
fn a_replayed_log_rebuilds_the_state_and_in_flight_markers() {
    let mut c = coordinator();
    let (pid, e) = init(&mut c, 0);
    let w1 = c
        .add_partitions(T, pid, e, &parts(&[0]), 1)
        .unwrap()
        .unwrap();
    let Ended::Prepared { write: w2, markers } = c.end_txn(T, pid, e, true, 2, false).unwrap()
    else {
        panic!()
    };
    let mut next = coordinator();
    for w in [w1, w2] {
        next.replay(w.txn_id, w.meta);
    }
    assert_eq!(next.in_flight(), vec![markers]);
    assert_eq!(next.describe(T), c.describe(T));
    next.replay(T.into(), None);
    assert!(next.describe(T).is_none(), "a tombstone forgets");
}

#[test]
fn under_transaction_version_2_every_end_bumps_the_epoch_and_a_retry_is_answered_again() {
    let mut c = coordinator();
    let (pid, e) = init(&mut c, 0);
    c.add_partitions(T, pid, e, &parts(&[0]), 1).unwrap();
    let Ended::Prepared { markers, .. } = c.end_txn(T, pid, e, true, 2, true).unwrap() else {
        panic!()
    };
    assert_eq!(
        markers.producer_epoch,
        e + 1,
        "the markers fence the old epoch"
    );
    assert_eq!(c.describe(T).unwrap().producer_epoch, e + 1);
    assert_eq!(
        c.end_txn(T, pid, e, true, 3, true),
        Err(ResponseError::ConcurrentTransactions),
        "a retry while the markers are written"
    );
    c.markers_written(T, pid, e + 1, 4).unwrap();
    assert_eq!(c.end_txn(T, pid, e, true, 5, true), Ok(Ended::AlreadyDone));
    assert_eq!(
        c.end_txn(T, pid, e, false, 5, true),
        Err(ResponseError::InvalidTxnState),
        "not the same request"
    );
    // The next transaction runs under the new epoch; the old one is fenced.
    assert_eq!(
        c.add_partitions(T, pid, e, &parts(&[0]), 6),
        Err(ResponseError::ProducerFenced)
    );
    c.add_partitions(T, pid, e + 1, &parts(&[0]), 6).unwrap();
    // A fencing InitProducerId forgets the retry: the old epoch is fenced for good.
    let _ = c.init_producer_id(T, 10_000, None, 7, &mut ids()).unwrap();
    assert_eq!(
        c.end_txn(T, pid, e, true, 8, true),
        Err(ResponseError::ProducerFenced)
    );
}
