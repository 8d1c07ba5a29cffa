//! SASL through the wire, where no real client would go: requests before authentication,
//! exchanges out of order, unknown mechanisms, raw tokens after a v0 handshake, a silent
//! connection, an expired session and a flood of failed logins. Real clients (librdkafka,
//! Kafka's tools) are in scripts/security-e2e.sh.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse,
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use crate::harness::{http, Raw, Spate};

const USERS: (&str, &str) = ("SPATE_BOOTSTRAP_USERS", "admin:admin-secret");

fn sasl_broker(extra: &[&str]) -> Spate {
    let mut args = vec!["--listeners", "SASL_PLAINTEXT://127.0.0.1:0"];
    args.extend(extra);
    Spate::start_with_env(&args, &[USERS])
}

fn handshake(raw: &mut Raw, version: i16, mechanism: &str) -> SaslHandshakeResponse {
    let mut r = SaslHandshakeRequest::default();
    r.mechanism = StrBytes::from_string(mechanism.to_string());
    raw.call(ApiKey::SaslHandshake, version, &r)
}

fn authenticate(raw: &mut Raw, token: &[u8]) -> SaslAuthenticateResponse {
    let mut r = SaslAuthenticateRequest::default();
    r.auth_bytes = Bytes::copy_from_slice(token);
    raw.call(ApiKey::SaslAuthenticate, 2, &r)
}

fn metadata(raw: &mut Raw) -> MetadataResponse {
    raw.call(ApiKey::Metadata, 12, &MetadataRequest::default())
}

fn login(raw: &mut Raw, password: &str) -> SaslAuthenticateResponse {
    assert_eq!(handshake(raw, 1, "PLAIN").error_code, 0);
    authenticate(raw, format!("\0admin\0{password}").as_bytes())
}

#[test]
fn only_api_versions_and_the_sasl_exchange_pass_before_authentication() {
    let spate = sasl_broker(&[]);
    let mut raw = Raw::connect(&spate.addr);
    let v: ApiVersionsResponse = raw.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default());
    assert_eq!(v.error_code, 0);
    assert!(v
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::SaslAuthenticate as i16));
    let h = handshake(&mut raw, 1, "PLAIN");
    assert_eq!(h.error_code, 0);
    let names: Vec<String> = h.mechanisms.iter().map(|m| m.to_string()).collect();
    assert_eq!(names, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]);
    let a = authenticate(&mut raw, b"\0admin\0admin-secret");
    assert_eq!(a.error_code, 0, "{:?}", a.error_message);
    assert_eq!(
        metadata(&mut raw).brokers.len(),
        1,
        "authenticated: requests pass"
    );

    // Metadata before authenticating: the connection closes, nothing answered.
    let mut early = Raw::connect(&spate.addr);
    early.send(ApiKey::Metadata, 12, &MetadataRequest::default());
    assert!(early.recv_frame().is_none(), "closed without an answer");
    // SaslAuthenticate before SaslHandshake: closed too.
    let mut out_of_order = Raw::connect(&spate.addr);
    let mut r = SaslAuthenticateRequest::default();
    r.auth_bytes = Bytes::from_static(b"\0admin\0admin-secret");
    out_of_order.send(ApiKey::SaslAuthenticate, 2, &r);
    assert!(out_of_order.recv_frame().is_none());
    // Between handshake and authentication only SaslAuthenticate passes.
    let mut midway = Raw::connect(&spate.addr);
    assert_eq!(handshake(&mut midway, 1, "PLAIN").error_code, 0);
    midway.send(ApiKey::Metadata, 12, &MetadataRequest::default());
    assert!(midway.recv_frame().is_none());
    // The authenticated connection is unaffected.
    assert_eq!(metadata(&mut raw).brokers.len(), 1);
}

#[test]
fn an_unknown_mechanism_or_a_wrong_password_is_answered_then_the_connection_closes() {
    let spate = sasl_broker(&["--sasl-mechanisms", "SCRAM-SHA-512"]);
    let mut raw = Raw::connect(&spate.addr);
    let h = handshake(&mut raw, 1, "GSSAPI");
    assert_eq!(h.error_code, ResponseError::UnsupportedSaslMechanism.code());
    let names: Vec<String> = h.mechanisms.iter().map(|m| m.to_string()).collect();
    assert_eq!(names, ["SCRAM-SHA-512"], "the enabled list");
    assert!(raw.is_closed());
    // PLAIN is not enabled on this broker.
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(
        handshake(&mut raw, 1, "PLAIN").error_code,
        ResponseError::UnsupportedSaslMechanism.code()
    );
    // A SCRAM exchange with garbage fails cleanly.
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(handshake(&mut raw, 1, "SCRAM-SHA-512").error_code, 0);
    let a = authenticate(&mut raw, b"n,,r=no-user-attribute");
    assert_eq!(a.error_code, ResponseError::SaslAuthenticationFailed.code());
    assert!(raw.is_closed());
}

#[test]
fn a_flood_of_failed_logins_neither_stops_the_broker_nor_floods_its_log() {
    let spate = sasl_broker(&[]);
    let started = Instant::now();
    for _ in 0..200 {
        let mut raw = Raw::connect(&spate.addr);
        let a = login(&mut raw, "wrong");
        assert_eq!(a.error_code, ResponseError::SaslAuthenticationFailed.code());
        let text = a.error_message.map(|m| m.to_string()).unwrap_or_default();
        assert!(
            !text.contains("wrong"),
            "the password is never echoed: {text}"
        );
        assert!(raw.is_closed());
    }
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(login(&mut raw, "admin-secret").error_code, 0);
    assert_eq!(metadata(&mut raw).brokers.len(), 1);
    let (_, metrics) = http(&spate.http, "GET", "/metrics", &[], "");
    assert!(
        metrics.contains("spate_sasl_authentication_failures_total 200"),
        "every failure counted"
    );
    assert!(metrics.contains("spate_sasl_authentications_total 1"));
    // At most one line a second per address (plus one for the second that is under way).
    let lines = spate.log().matches("authentication failed").count() as u64;
    let allowed = started.elapsed().as_secs() + 2;
    assert!(
        (1..=allowed).contains(&lines),
        "{lines} failure lines in {:?}",
        started.elapsed()
    );
}

#[test]
fn raw_tokens_after_a_v0_handshake_authenticate() {
    let spate = sasl_broker(&[]);
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(handshake(&mut raw, 0, "PLAIN").error_code, 0);
    let token = b"\0admin\0admin-secret";
    let mut framed = (token.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(token);
    raw.send_bytes(&framed);
    let answer = raw.recv_frame().expect("a raw token back");
    assert!(answer.is_empty(), "PLAIN's answer is empty");
    assert_eq!(metadata(&mut raw).brokers.len(), 1);
    // A wrong raw token closes the connection (raw framing carries no error).
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(handshake(&mut raw, 0, "PLAIN").error_code, 0);
    let bad = b"\0admin\0nope";
    let mut framed = (bad.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(bad);
    raw.send_bytes(&framed);
    assert!(raw.recv_frame().is_none());
}

#[test]
fn a_silent_connection_is_closed_and_an_expired_session_must_re_authenticate() {
    let spate = sasl_broker(&[
        "--connections-auth-timeout-ms",
        "300",
        "--connections-max-reauth-ms",
        "600",
    ]);
    // Connects and says nothing: closed once the auth timeout passes.
    let mut silent = Raw::connect(&spate.addr);
    assert!(silent.recv_frame().is_none(), "closed by the broker");
    // Authenticated, then re-authenticated before the session ends: still served.
    let mut raw = Raw::connect(&spate.addr);
    let a = login(&mut raw, "admin-secret");
    assert_eq!(a.error_code, 0);
    assert_eq!(a.session_lifetime_ms, 600);
    assert_eq!(login(&mut raw, "admin-secret").error_code, 0);
    assert_eq!(metadata(&mut raw).brokers.len(), 1);
    // Past the session's end without re-authenticating: the next request closes it.
    std::thread::sleep(Duration::from_millis(800));
    raw.send(ApiKey::Metadata, 12, &MetadataRequest::default());
    assert!(raw.recv_frame().is_none());
}

#[test]
fn http_basic_users_and_acls_guard_the_http_side_and_the_probes_stay_open() {
    use base64::Engine;
    use kafka_protocol::messages::create_acls_request::AclCreation;
    use kafka_protocol::messages::{CreateAclsRequest, CreateAclsResponse};
    let spate = Spate::start_with_env(
        &[
            "--listeners",
            "SASL_PLAINTEXT://127.0.0.1:0",
            "--http-auth",
            "basic",
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin",
            "--admin-token",
            "tok",
        ],
        &[(
            "SPATE_BOOTSTRAP_USERS",
            "admin:admin-secret,alice:alice-secret",
        )],
    );
    let basic = |user: &str, password: &str| {
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {b64}")
    };
    let get = |path: &str, auth: Option<&str>| {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        http(&spate.http, "GET", path, &headers, "").0
    };
    let admin = basic("admin", "admin-secret");
    let alice = basic("alice", "alice-secret");
    assert_eq!(get("/health", None), 200);
    assert_eq!(get("/metrics", None), 200, "not protected unless asked");
    assert_eq!(get("/admin/topics", None), 401);
    assert_eq!(get("/admin/topics", Some(&basic("alice", "nope"))), 401);
    assert_eq!(get("/admin/topics", Some(&basic("ghost", "x"))), 401);
    assert_eq!(get("/admin/topics", Some(&admin)), 200, "a super user");
    assert_eq!(
        get("/admin/topics", Some("Bearer tok")),
        200,
        "the admin token"
    );
    assert_eq!(
        get("/admin/topics", Some(&alice)),
        403,
        "no Describe on the cluster"
    );
    // Ingest is Write on its topic.
    let ingest = |auth: &str| {
        http(
            &spate.http,
            "POST",
            "/topics/orders?acks=1",
            &[
                ("Authorization", auth),
                ("Content-Type", "application/vnd.kafka.json.v2+json"),
            ],
            r#"{"records":[{"value":{"n":1}}]}"#,
        )
        .0
    };
    assert_eq!(ingest(&alice), 403);
    let mut raw = Raw::connect(&spate.addr);
    assert_eq!(login(&mut raw, "admin-secret").error_code, 0);
    let mut c = AclCreation::default();
    c.resource_type = 2;
    c.resource_name = StrBytes::from_static_str("orders");
    c.resource_pattern_type = 3;
    c.principal = StrBytes::from_static_str("User:alice");
    c.host = StrBytes::from_static_str("*");
    c.operation = 4;
    c.permission_type = 3;
    let mut req = CreateAclsRequest::default();
    req.creations = vec![c];
    let resp: CreateAclsResponse = raw.call(ApiKey::CreateAcls, 3, &req);
    assert_eq!(
        resp.results[0].error_code, 0,
        "{:?}",
        resp.results[0].error_message
    );
    assert_eq!(ingest(&alice), 200, "allowed once the ACL exists");
    // Metadata's authorized operations are the client's: alice may Write (so Describe) orders.
    let mut as_alice = Raw::connect(&spate.addr);
    assert_eq!(handshake(&mut as_alice, 1, "PLAIN").error_code, 0);
    assert_eq!(
        authenticate(&mut as_alice, b"\0alice\0alice-secret").error_code,
        0
    );
    let mut t = kafka_protocol::messages::metadata_request::MetadataRequestTopic::default();
    t.name = Some(StrBytes::from_static_str("orders").into());
    let mut m = MetadataRequest::default();
    m.topics = Some(vec![t]);
    m.include_topic_authorized_operations = true;
    let md: MetadataResponse = as_alice.call(ApiKey::Metadata, 10, &m);
    assert_eq!(md.topics[0].error_code, 0);
    assert_eq!(
        md.topics[0].topic_authorized_operations,
        (1 << 4) | (1 << 8)
    );
    let md: MetadataResponse = raw.call(ApiKey::Metadata, 10, &m);
    assert_eq!(
        md.topics[0].topic_authorized_operations,
        (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11),
        "the super user: every topic operation"
    );
}

#[test]
fn cluster_actions_quotas_log_dirs_and_commits_need_their_acls() {
    use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
    use kafka_protocol::messages::alter_replica_log_dirs_request::{
        AlterReplicaLogDir, AlterReplicaLogDirTopic,
    };
    use kafka_protocol::messages::create_acls_request::AclCreation;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    use kafka_protocol::messages::write_txn_markers_request::{
        WritableTxnMarker, WritableTxnMarkerTopic,
    };
    use kafka_protocol::messages::*;
    let spate = Spate::start_with_env(
        &[
            "--listeners",
            "SASL_PLAINTEXT://127.0.0.1:0",
            "--authorizer",
            "acl",
            "--super-users",
            "User:admin",
        ],
        &[(
            "SPATE_BOOTSTRAP_USERS",
            "admin:admin-secret,alice:alice-secret",
        )],
    );
    let as_user = |user: &str| {
        let mut raw = Raw::connect(&spate.addr);
        assert_eq!(handshake(&mut raw, 1, "PLAIN").error_code, 0);
        let token = format!("\0{user}\0{user}-secret");
        assert_eq!(authenticate(&mut raw, token.as_bytes()).error_code, 0);
        raw
    };
    let mut admin = as_user("admin");
    let mut alice = as_user("alice");
    // A topic to name, and Read on alice's group (not on the topic).
    let mut t = kafka_protocol::messages::create_topics_request::CreatableTopic::default();
    t.name = TopicName(StrBytes::from_static_str("ledger"));
    t.num_partitions = 1;
    t.replication_factor = 1;
    let mut ct = CreateTopicsRequest::default();
    ct.topics = vec![t];
    ct.timeout_ms = 10_000;
    let r: CreateTopicsResponse = admin.call(ApiKey::CreateTopics, 5, &ct);
    assert_eq!(r.topics[0].error_code, 0);
    let mut acl = AclCreation::default();
    acl.resource_type = 3; // group
    acl.resource_name = StrBytes::from_static_str("alice-group");
    acl.resource_pattern_type = 3;
    acl.principal = StrBytes::from_static_str("User:alice");
    acl.host = StrBytes::from_static_str("*");
    acl.operation = 3; // read
    acl.permission_type = 3;
    let mut ca = CreateAclsRequest::default();
    ca.creations = vec![acl];
    let r: CreateAclsResponse = admin.call(ApiKey::CreateAcls, 3, &ca);
    assert_eq!(r.results[0].error_code, 0);

    let cluster_denied = ResponseError::ClusterAuthorizationFailed.code();
    let topic_denied = ResponseError::TopicAuthorizationFailed.code();

    let mut tm = WritableTxnMarkerTopic::default();
    tm.name = TopicName(StrBytes::from_static_str("ledger"));
    tm.partition_indexes = vec![0];
    let mut m = WritableTxnMarker::default();
    m.producer_id = 7.into();
    m.topics = vec![tm];
    let mut wtm = WriteTxnMarkersRequest::default();
    wtm.markers = vec![m];
    let r: WriteTxnMarkersResponse = alice.call(ApiKey::WriteTxnMarkers, 1, &wtm);
    assert_eq!(
        r.markers[0].topics[0].partitions[0].error_code,
        cluster_denied
    );

    let epoch_request = |replica: i32| {
        let mut p = OffsetForLeaderPartition::default();
        p.partition = 0;
        p.current_leader_epoch = -1;
        p.leader_epoch = 0;
        let mut t = OffsetForLeaderTopic::default();
        t.topic = TopicName(StrBytes::from_static_str("ledger"));
        t.partitions = vec![p];
        let mut r = OffsetForLeaderEpochRequest::default();
        r.replica_id = replica.into();
        r.topics = vec![t];
        r
    };
    let r: OffsetForLeaderEpochResponse =
        alice.call(ApiKey::OffsetForLeaderEpoch, 4, &epoch_request(-1));
    assert_eq!(r.topics[0].partitions[0].error_code, topic_denied);
    let r: OffsetForLeaderEpochResponse =
        alice.call(ApiKey::OffsetForLeaderEpoch, 4, &epoch_request(1));
    assert_eq!(r.topics[0].partitions[0].error_code, cluster_denied);
    let r: OffsetForLeaderEpochResponse =
        admin.call(ApiKey::OffsetForLeaderEpoch, 4, &epoch_request(-1));
    assert_eq!(
        r.topics[0].partitions[0].error_code, 0,
        "the super user may"
    );

    let mut ent = EntityData::default();
    ent.entity_type = StrBytes::from_static_str("user");
    ent.entity_name = Some(StrBytes::from_static_str("alice"));
    let mut op = OpData::default();
    op.key = StrBytes::from_static_str("producer_byte_rate");
    op.value = 1024.0;
    let mut entry = EntryData::default();
    entry.entity = vec![ent];
    entry.ops = vec![op];
    let mut acq = AlterClientQuotasRequest::default();
    acq.entries = vec![entry];
    let r: AlterClientQuotasResponse = alice.call(ApiKey::AlterClientQuotas, 1, &acq);
    assert_eq!(r.entries[0].error_code, cluster_denied);
    assert_eq!(r.entries[0].entity[0].entity_name.as_deref(), Some("alice"));

    let mut lt = AlterReplicaLogDirTopic::default();
    lt.name = TopicName(StrBytes::from_static_str("ledger"));
    lt.partitions = vec![0];
    let mut ld = AlterReplicaLogDir::default();
    ld.path = StrBytes::from_static_str("/elsewhere");
    ld.topics = vec![lt];
    let mut ard = AlterReplicaLogDirsRequest::default();
    ard.dirs = vec![ld];
    let r: AlterReplicaLogDirsResponse = alice.call(ApiKey::AlterReplicaLogDirs, 2, &ard);
    assert_eq!(r.results[0].partitions[0].error_code, cluster_denied);

    let commit = || {
        let mut p = OffsetCommitRequestPartition::default();
        p.partition_index = 0;
        p.committed_offset = 0;
        let mut t = OffsetCommitRequestTopic::default();
        t.name = TopicName(StrBytes::from_static_str("ledger"));
        t.partitions = vec![p];
        let mut r = OffsetCommitRequest::default();
        r.group_id = StrBytes::from_static_str("alice-group").into();
        r.generation_id_or_member_epoch = -1;
        r.topics = vec![t];
        r
    };
    let r: OffsetCommitResponse = alice.call(ApiKey::OffsetCommit, 8, &commit());
    assert_eq!(
        r.topics[0].partitions[0].error_code, topic_denied,
        "Read on the group is not Read on the topic"
    );
    let r: OffsetCommitResponse = admin.call(ApiKey::OffsetCommit, 8, &commit());
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
}
