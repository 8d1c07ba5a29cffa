//! The API end to end over a log in memory (and one over a real broker): what clients see.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::log::MemoryLog;
use crate::registry::{Registry, Settings};
use crate::RegistryError;

const CT: &str = "application/vnd.schemaregistry.v1+json";

struct Api {
    reg: Arc<Registry>,
    log: Arc<MemoryLog>,
}

impl Api {
    async fn new() -> Self {
        Self::over(MemoryLog::new(), Settings::default()).await
    }

    async fn over(log: Arc<MemoryLog>, settings: Settings) -> Self {
        let reg = Registry::start(Arc::new(log.clone()), settings).await;
        Self { reg, log }
    }

    /// A registry started again over the same records: what a restart rebuilds.
    async fn restarted(&self) -> Self {
        Self::over(self.log.clone(), Settings::default()).await
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let req = Request::builder().method(method).uri(path);
        let req = match body {
            Some(b) => req
                .header("content-type", CT)
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .unwrap();
        self.send(req).await
    }

    async fn send(&self, req: Request<Body>) -> (StatusCode, Value) {
        let resp = crate::router(self.reg.clone()).oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, v)
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call("GET", path, None).await
    }

    async fn register(&self, subject: &str, schema: &str) -> (StatusCode, Value) {
        self.call(
            "POST",
            &format!("/subjects/{subject}/versions"),
            Some(json!({ "schema": schema })),
        )
        .await
    }

    async fn register_json(&self, subject: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", &format!("/subjects/{subject}/versions"), Some(body))
            .await
    }
}

fn code(v: &Value) -> i64 {
    v["error_code"].as_i64().unwrap_or(0)
}

const USER_V1: &str = r#"{"type":"record","name":"User","namespace":"com.acme","fields":[{"name":"id","type":"long"}]}"#;
const USER_V2: &str = r#"{"type":"record","name":"User","namespace":"com.acme","fields":[{"name":"id","type":"long"},{"name":"email","type":["null","string"],"default":null}]}"#;
const USER_BAD: &str = r#"{"type":"record","name":"User","namespace":"com.acme","fields":[{"name":"id","type":"long"},{"name":"age","type":"int"}]}"#;

#[tokio::test]
async fn the_same_schema_gets_one_id_across_subjects_and_versions_count_per_subject() {
    let api = Api::new().await;
    let (s, v) = api.register("users-value", USER_V1).await;
    assert_eq!((s, v["id"].as_i64()), (StatusCode::OK, Some(1)));
    // Again, with other whitespace: the same id, no new version.
    let spaced = USER_V1.replace(',', ", ");
    let (_, v) = api.register("users-value", &spaced).await;
    assert_eq!(v["id"], 1);
    assert_eq!(
        api.get("/subjects/users-value/versions").await.1,
        json!([1])
    );
    // Another subject: the same id, its own version 1.
    let (_, v) = api.register("audit-value", USER_V1).await;
    assert_eq!(v["id"], 1);
    let (_, v) = api.register("users-value", USER_V2).await;
    assert_eq!(v["id"], 2);
    assert_eq!(
        api.get("/subjects/users-value/versions").await.1,
        json!([1, 2])
    );
    assert_eq!(
        api.get("/subjects").await.1,
        json!(["audit-value", "users-value"])
    );
    let (_, latest) = api.get("/subjects/users-value/versions/latest").await;
    assert_eq!(latest["version"], 2);
    assert_eq!(latest["id"], 2);
    assert_eq!(latest["subject"], "users-value");
    assert!(latest.get("schemaType").is_none(), "AVRO is left out");
    assert_eq!(api.get("/subjects/users-value/versions/-1").await.1, latest);
    let (_, raw) = api.get("/subjects/users-value/versions/1/schema").await;
    assert_eq!(raw["name"], "User", "the schema itself is the body");
    let (_, by_id) = api.get("/schemas/ids/1").await;
    assert_eq!(by_id["schema"], USER_V1);
    assert_eq!(
        api.get("/schemas/ids/1/subjects").await.1,
        json!(["audit-value", "users-value"])
    );
    assert_eq!(
        api.get("/schemas/ids/1/versions").await.1,
        json!([{"subject":"audit-value","version":1},{"subject":"users-value","version":1}])
    );
    // Lookup finds the version holding a schema.
    let (s, found) = api
        .call(
            "POST",
            "/subjects/users-value",
            Some(json!({"schema": USER_V2})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (found["id"].as_i64(), found["version"].as_i64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        api.get("/schemas/types").await.1,
        json!(["JSON", "PROTOBUF", "AVRO"])
    );
    assert_eq!(api.get("/contexts").await.1, json!(["."]));
}

#[tokio::test]
async fn an_incompatible_schema_is_refused_with_409_and_the_check_endpoint_says_why() {
    let api = Api::new().await;
    api.register("u", USER_V1).await;
    let (s, v) = api.register("u", USER_BAD).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(code(&v), 409);
    assert!(v["message"].as_str().unwrap().contains("age"), "{v}");
    let (s, v) = api
        .call(
            "POST",
            "/compatibility/subjects/u/versions/latest?verbose=true",
            Some(json!({ "schema": USER_BAD })),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["is_compatible"], false);
    assert!(v["messages"][0]
        .as_str()
        .unwrap()
        .starts_with("READER_FIELD_MISSING_DEFAULT_VALUE"));
    let (_, v) = api
        .call(
            "POST",
            "/compatibility/subjects/u/versions/1",
            Some(json!({ "schema": USER_V2 })),
        )
        .await;
    assert_eq!(v, json!({"is_compatible": true}));
    // With NONE for the subject it registers.
    let (s, v) = api
        .call("PUT", "/config/u", Some(json!({"compatibility": "NONE"})))
        .await;
    assert_eq!((s, v), (StatusCode::OK, json!({"compatibility": "NONE"})));
    let (s, _) = api.register("u", USER_BAD).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn bad_input_gets_confluents_error_codes() {
    let api = Api::new().await;
    api.register("u", USER_V1).await;
    let cases: Vec<(&str, &str, Option<Value>, u16, i64)> = vec![
        ("GET", "/subjects/nope/versions", None, 404, 40401),
        ("GET", "/subjects/nope/versions/1", None, 404, 40401),
        ("GET", "/subjects/u/versions/9", None, 404, 40402),
        ("GET", "/subjects/u/versions/zero", None, 422, 42202),
        ("GET", "/subjects/u/versions/0", None, 422, 42202),
        ("GET", "/schemas/ids/99", None, 404, 40403),
        // A malformed id is no path at all (Confluent: a plain 404, not 40403).
        ("GET", "/schemas/ids/x", None, 404, 404),
        (
            "POST",
            "/subjects/u/versions",
            Some(json!({"schema": "{\"type\":\"record\"}"})),
            422,
            42201,
        ),
        (
            "POST",
            "/subjects/u/versions",
            Some(json!({"schema": "not json"})),
            422,
            42201,
        ),
        ("POST", "/subjects/u/versions", Some(json!({})), 422, 42201),
        (
            "POST",
            "/subjects/u/versions",
            Some(json!({"schema": "message {", "schemaType": "PROTOBUF"})),
            422,
            42201,
        ),
        (
            "POST",
            "/subjects/r/versions",
            Some(json!({
                "schema": "{\"type\":\"record\",\"name\":\"A\",\"fields\":[{\"name\":\"b\",\"type\":\"B\"}]}",
                "references": [{"name": "B", "subject": "missing", "version": 1}]
            })),
            422,
            42201,
        ),
        (
            "POST",
            "/subjects/u",
            Some(json!({"schema": "\"string\""})),
            404,
            40403,
        ),
        (
            "PUT",
            "/config",
            Some(json!({"compatibility": "SIDEWAYS"})),
            422,
            42203,
        ),
        (
            "PUT",
            "/mode",
            Some(json!({"mode": "SOMETIMES"})),
            422,
            42204,
        ),
        ("GET", "/config/u", None, 404, 40408),
        ("GET", "/mode/u", None, 404, 40409),
        ("GET", "/nowhere", None, 404, 404),
        ("DELETE", "/schemas/types", None, 405, 405),
    ];
    for (method, path, body, status, want) in cases {
        let (s, v) = api.call(method, path, body.clone()).await;
        assert_eq!(
            (s.as_u16(), code(&v)),
            (status, want),
            "{method} {path} {body:?}: {v}"
        );
    }
    // Not JSON at all, a wrong content type, a body over the limit.
    let req = Request::builder()
        .method("POST")
        .uri("/subjects/u/versions")
        .header("content-type", CT)
        .body(Body::from("{oops"))
        .unwrap();
    assert_eq!(code(&api.send(req).await.1), 400);
    let req = Request::builder()
        .method("POST")
        .uri("/subjects/u/versions")
        .header("content-type", "text/plain")
        .body(Body::from("{}"))
        .unwrap();
    assert_eq!(code(&api.send(req).await.1), 415);
    let small = Api::over(
        MemoryLog::new(),
        Settings {
            max_body_bytes: 64,
            ..Settings::default()
        },
    )
    .await;
    let (s, v) = small.register("u", &" ".repeat(100)).await;
    assert_eq!((s.as_u16(), code(&v)), (413, 413));
    // A body that does not arrive in time.
    let slow = Api::over(
        MemoryLog::new(),
        Settings {
            body_timeout: std::time::Duration::from_millis(50),
            ..Settings::default()
        },
    )
    .await;
    let (_tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(1);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let req = Request::builder()
        .method("POST")
        .uri("/subjects/u/versions")
        .header("content-type", CT)
        .body(Body::from_stream(stream))
        .unwrap();
    let (s, v) = slow.send(req).await;
    assert_eq!((s.as_u16(), code(&v)), (408, 408));
    // A schema over the schema limit is invalid.
    let tight = Api::over(
        MemoryLog::new(),
        Settings {
            max_schema_bytes: 16,
            ..Settings::default()
        },
    )
    .await;
    let (s, v) = tight.register("u", USER_V1).await;
    assert_eq!((s.as_u16(), code(&v)), (422, 42201));
}

#[tokio::test]
async fn an_id_freed_by_a_permanent_delete_is_not_handed_out_again_after_compaction() {
    let api = Api::new().await;
    assert_eq!(api.register("u", USER_V1).await.1["id"], 1);
    assert_eq!(api.register("u", USER_V2).await.1["id"], 2);
    assert_eq!(api.register("w", r#""string""#).await.1["id"], 3);
    // The versions holding the two highest ids go for good: one by version, one by subject.
    api.call("DELETE", "/subjects/u/versions/2", None).await;
    let (_, v) = api
        .call("DELETE", "/subjects/u/versions/2?permanent=true", None)
        .await;
    assert_eq!(v, json!(2));
    api.call("DELETE", "/subjects/w", None).await;
    let (_, v) = api.call("DELETE", "/subjects/w?permanent=true", None).await;
    assert_eq!(v, json!([1]));
    // Compaction removes their SCHEMA records and tombstones; a restart reads what is left.
    let after = Api::over(api.log.compacted(), Settings::default()).await;
    assert_eq!(after.get("/subjects/u/versions").await.1, json!([1]));
    assert_eq!(code(&after.get("/schemas/ids/3").await.1), 40403);
    let (s, v) = after.register("x", r#""long""#).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["id"], 4, "ids 2 and 3 were handed out once already");
}

#[tokio::test]
async fn deletes_go_soft_then_permanent_and_say_when_out_of_order() {
    let api = Api::new().await;
    api.register("u", USER_V1).await;
    api.register("u", USER_V2).await;
    // Permanent before soft: refused.
    let (_, v) = api
        .call("DELETE", "/subjects/u/versions/1?permanent=true", None)
        .await;
    assert_eq!(code(&v), 40407);
    let (_, v) = api.call("DELETE", "/subjects/u/versions/1", None).await;
    assert_eq!(v, json!(1));
    let (_, v) = api.call("DELETE", "/subjects/u/versions/1", None).await;
    assert_eq!(code(&v), 40406);
    assert_eq!(api.get("/subjects/u/versions").await.1, json!([2]));
    assert_eq!(
        api.get("/subjects/u/versions?deleted=true").await.1,
        json!([1, 2])
    );
    assert_eq!(
        api.get("/subjects/u/versions/1?deleted=true").await.1["id"],
        1
    );
    assert_eq!(code(&api.get("/subjects/u/versions/1").await.1), 40402);
    // Soft-deleted schemas keep their ids.
    assert_eq!(api.get("/schemas/ids/1").await.0, StatusCode::OK);
    let (_, v) = api
        .call("DELETE", "/subjects/u/versions/1?permanent=true", None)
        .await;
    assert_eq!(v, json!(1));
    assert_eq!(code(&api.get("/schemas/ids/1").await.1), 40403);
    // The subject: permanent first is refused, soft then permanent works.
    let (_, v) = api.call("DELETE", "/subjects/u?permanent=true", None).await;
    assert_eq!(code(&v), 40405);
    let (_, v) = api.call("DELETE", "/subjects/u", None).await;
    assert_eq!(v, json!([2]));
    let (_, v) = api.call("DELETE", "/subjects/u", None).await;
    assert_eq!(code(&v), 40404);
    assert_eq!(api.get("/subjects").await.1, json!([]));
    assert_eq!(api.get("/subjects?deleted=true").await.1, json!(["u"]));
    let (_, v) = api.call("DELETE", "/subjects/u?permanent=true", None).await;
    assert_eq!(v, json!([2]));
    assert_eq!(api.get("/subjects?deleted=true").await.1, json!([]));
    assert_eq!(
        code(&api.call("DELETE", "/subjects/u", None).await.1),
        40401
    );
    // Registering again starts at version 1 with a new id: ids are not reused.
    let (_, v) = api.register("u", USER_V1).await;
    assert_eq!(v["id"], 3);
    assert_eq!(api.get("/subjects/u/versions").await.1, json!([1]));
}

#[tokio::test]
async fn references_resolve_and_a_referenced_version_cannot_be_deleted() {
    let api = Api::new().await;
    let address = r#"{"type":"record","name":"Address","namespace":"com.acme","fields":[{"name":"city","type":"string"}]}"#;
    api.register("address", address).await;
    let user = r#"{"type":"record","name":"User","namespace":"com.acme","fields":[{"name":"home","type":"Address"}]}"#;
    let (s, v) = api
        .register_json(
            "user",
            json!({"schema": user, "references": [{"name": "com.acme.Address", "subject": "address", "version": 1}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["id"], 2);
    let (_, got) = api.get("/subjects/user/versions/1").await;
    assert_eq!(
        got["references"],
        json!([{"name": "com.acme.Address", "subject": "address", "version": 1}])
    );
    assert_eq!(
        api.get("/subjects/address/versions/1/referencedby").await.1,
        json!([2])
    );
    let (_, v) = api
        .call("DELETE", "/subjects/address/versions/1", None)
        .await;
    assert_eq!(code(&v), 42206);
    let (_, v) = api.call("DELETE", "/subjects/address", None).await;
    assert_eq!(code(&v), 42206);
    // JSON Schema references by file name.
    let (s, _) = api
        .register_json(
            "geo",
            json!({"schemaType": "JSON", "schema": r#"{"type":"object","properties":{"lat":{"type":"number"}}}"#}),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, v) = api
        .register_json(
            "place",
            json!({"schemaType": "JSON",
                   "schema": r#"{"type":"object","properties":{"at":{"$ref":"geo.json"}}}"#,
                   "references": [{"name": "geo.json", "subject": "geo", "version": 1}]}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, got) = api.get(&format!("/schemas/ids/{}", v["id"])).await;
    assert_eq!(got["schemaType"], "JSON");
}

#[tokio::test]
async fn configs_and_modes_are_set_read_and_removed_per_subject_and_globally() {
    let api = Api::new().await;
    assert_eq!(
        api.get("/config").await.1,
        json!({"compatibilityLevel": "BACKWARD"})
    );
    api.call("PUT", "/config", Some(json!({"compatibility": "full"})))
        .await;
    assert_eq!(
        api.get("/config").await.1,
        json!({"compatibilityLevel": "FULL"})
    );
    assert_eq!(
        api.get("/config/x?defaultToGlobal=true").await.1,
        json!({"compatibilityLevel": "FULL"})
    );
    api.call(
        "PUT",
        "/config/x",
        Some(json!({"compatibility": "FORWARD_TRANSITIVE"})),
    )
    .await;
    assert_eq!(
        api.get("/config/x").await.1,
        json!({"compatibilityLevel": "FORWARD_TRANSITIVE"})
    );
    assert_eq!(
        api.call("DELETE", "/config/x", None).await.1,
        json!({"compatibilityLevel": "FORWARD_TRANSITIVE"})
    );
    assert_eq!(code(&api.get("/config/x").await.1), 40408);
    assert_eq!(
        api.call("DELETE", "/config", None).await.1,
        json!({"compatibilityLevel": "FULL"})
    );
    assert_eq!(
        api.get("/config").await.1,
        json!({"compatibilityLevel": "BACKWARD"})
    );
    // Modes: READONLY refuses writes to its subject only.
    assert_eq!(api.get("/mode").await.1, json!({"mode": "READWRITE"}));
    api.call("PUT", "/mode/locked", Some(json!({"mode": "READONLY"})))
        .await;
    let (_, v) = api.register("locked", USER_V1).await;
    assert_eq!(code(&v), 42205);
    let (s, _) = api.register("open", USER_V1).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(api.get("/mode/locked").await.1, json!({"mode": "READONLY"}));
    assert_eq!(
        api.call("DELETE", "/mode/locked", None).await.1,
        json!({"mode": "READONLY"})
    );
    assert_eq!(api.register("locked", USER_V1).await.0, StatusCode::OK);
    // IMPORT needs an empty registry unless forced, then takes ids and versions as given.
    let (_, v) = api
        .call("PUT", "/mode", Some(json!({"mode": "IMPORT"})))
        .await;
    assert_eq!(code(&v), 42205);
    let (_, v) = api
        .register_json("imp", json!({"schema": USER_V2, "id": 50, "version": 7}))
        .await;
    assert_eq!(code(&v), 42205, "ids only in IMPORT mode");
    let (s, _) = api
        .call("PUT", "/mode?force=true", Some(json!({"mode": "IMPORT"})))
        .await;
    assert_eq!(s, StatusCode::OK);
    let (_, v) = api
        .register_json("imp", json!({"schema": USER_V2, "id": 50, "version": 7}))
        .await;
    assert_eq!(v, json!({"id": 50}));
    assert_eq!(api.get("/subjects/imp/versions").await.1, json!([7]));
    // An id given to a different schema is refused.
    let (_, v) = api
        .register_json("imp", json!({"schema": USER_BAD, "id": 50, "version": 8}))
        .await;
    assert_eq!(code(&v), 42207);
    api.call("PUT", "/mode", Some(json!({"mode": "READWRITE"})))
        .await;
    // New ids continue above the imported one.
    let (_, v) = api.register("after", USER_BAD).await;
    assert_eq!(v["id"], 51);
}

#[tokio::test]
async fn a_restart_rebuilds_ids_versions_configs_modes_and_deletes_from_the_log() {
    let api = Api::new().await;
    api.register("a", USER_V1).await;
    api.register("a", USER_V2).await;
    api.register("b", USER_V2).await;
    api.call("PUT", "/config/a", Some(json!({"compatibility": "FULL"})))
        .await;
    api.call("PUT", "/mode/b", Some(json!({"mode": "READONLY"})))
        .await;
    api.call("DELETE", "/subjects/a/versions/1", None).await;
    let paths = [
        "/subjects",
        "/subjects?deleted=true",
        "/subjects/a/versions",
        "/subjects/a/versions?deleted=true",
        "/subjects/a/versions/2",
        "/subjects/b/versions/latest",
        "/schemas/ids/1",
        "/schemas/ids/2/versions",
        "/config/a",
        "/mode/b",
    ];
    let mut before = Vec::new();
    for p in paths {
        before.push(api.get(p).await);
    }
    let again = api.restarted().await;
    for (p, want) in paths.iter().zip(before) {
        assert_eq!(again.get(p).await, want, "{p}");
    }
    // The next id continues after the highest one.
    again.call("DELETE", "/mode/b", None).await;
    let (_, v) = again.register("c", USER_BAD).await;
    assert_eq!(v["id"], 3);
}

#[tokio::test]
async fn a_failed_write_changes_nothing() {
    let api = Api::new().await;
    api.register("a", USER_V1).await;
    *api.log.fail_appends.lock() = Some(RegistryError::Store("disk full".into()));
    let (s, v) = api.register("a", USER_V2).await;
    assert_eq!((s.as_u16(), code(&v)), (500, 50001));
    *api.log.fail_appends.lock() = None;
    assert_eq!(api.get("/subjects/a/versions").await.1, json!([1]));
    let (_, v) = api.register("a", USER_V2).await;
    assert_eq!(v["id"], 2);
}

#[tokio::test]
async fn requests_and_errors_are_counted() {
    let api = Api::new().await;
    api.register("a", USER_V1).await;
    api.get("/subjects/nope/versions").await;
    let text = api.reg.metrics.render();
    assert!(
        text.contains("spate_schema_registry_requests_total 2"),
        "{text}"
    );
    assert!(
        text.contains(r#"spate_schema_registry_errors_total{error_code="40401"} 1"#),
        "{text}"
    );
    assert!(text.contains("spate_schema_registry_schemas 1"), "{text}");
    assert!(text.contains("spate_schema_registry_subjects 1"), "{text}");
    assert!(
        text.contains("spate_schema_registry_registrations_total 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_real_broker_schemas_land_in_a_compacted_topic_and_survive_a_reopen() {
    use spate_broker::{Broker, BrokerConfig};
    let dir = tempfile::tempdir().unwrap();
    let open = || {
        Broker::open(BrokerConfig::new(
            dir.path().join("data"),
            "127.0.0.1",
            9092,
        ))
        .unwrap()
        .0
    };
    let broker = open();
    let timeout = std::time::Duration::from_secs(10);
    let log = Arc::new(crate::BrokerLog::new(broker.clone(), timeout));
    let reg = Registry::start(log, Settings::default()).await;
    let topic = broker.topics.get(crate::records::TOPIC).expect("created");
    assert_eq!(
        topic.with_config(|c| c.get("cleanup.policy").map(|(v, _)| v.to_string())),
        Some("compact".to_string())
    );
    let id = reg
        .register(
            "u",
            crate::registry::SchemaRequest {
                schema: Some(USER_V1.into()),
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(id, 1);
    reg.set_config(
        Some("u"),
        crate::registry::ConfigRequest {
            compatibility: Some("NONE".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    drop(reg);
    broker.shutdown();
    drop(topic);
    drop(broker);
    let broker = open();
    let log = Arc::new(crate::BrokerLog::new(broker.clone(), timeout));
    let reg = Registry::start(log, Settings::default()).await;
    assert_eq!(reg.version("u", "latest", false).unwrap().id, 1);
    assert_eq!(
        reg.config(Some("u"), false).unwrap().compatibility_level,
        "NONE"
    );
    broker.shutdown();
}

const PROTO_V1: &str = "syntax = \"proto3\";\npackage acme;\nimport \"google/protobuf/timestamp.proto\";\nmessage Order {\n  string id = 1; // the order's id\n  google.protobuf.Timestamp at = 2;\n}\n";

#[tokio::test]
async fn protobuf_text_and_its_descriptor_register_as_one_schema_and_serve_both_forms() {
    let api = Api::new().await;
    let (s, v) = api
        .register_json(
            "orders-value",
            json!({"schema": PROTO_V1, "schemaType": "PROTOBUF"}),
        )
        .await;
    assert_eq!((s, v["id"].as_i64()), (StatusCode::OK, Some(1)), "{v}");
    let (_, stored) = api.get("/schemas/ids/1").await;
    assert_eq!(stored["schemaType"], "PROTOBUF");
    let text = stored["schema"].as_str().unwrap().to_string();
    assert!(
        text.contains(".google.protobuf.Timestamp at = 2;"),
        "{text}"
    );
    assert!(!text.contains("the order's id"), "comments are not kept");
    // The descriptor form (what Confluent's serializers send and ask for) is the same schema.
    let (_, ser) = api.get("/schemas/ids/1?format=serialized").await;
    let b64 = ser["schema"].as_str().unwrap().to_string();
    assert!(!b64.contains(' ') && b64 != text, "{b64}");
    let (_, again) = api
        .register_json(
            "orders-value",
            json!({"schema": b64, "schemaType": "PROTOBUF"}),
        )
        .await;
    assert_eq!(again["id"], 1);
    assert_eq!(
        api.get("/subjects/orders-value/versions").await.1,
        json!([1])
    );
    let (_, latest) = api
        .get("/subjects/orders-value/versions/latest?format=serialized")
        .await;
    assert_eq!(latest["schema"].as_str(), Some(b64.as_str()));
    // Reusing field 1 with another wire type is refused; adding a field is not.
    let bad = PROTO_V1.replace("string id = 1;", "int64 id = 1;");
    let (s, v) = api
        .register_json(
            "orders-value",
            json!({"schema": bad, "schemaType": "PROTOBUF"}),
        )
        .await;
    assert_eq!((s, code(&v)), (StatusCode::CONFLICT, 409), "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("FIELD_SCALAR_KIND_CHANGED"),
        "{v}"
    );
    let good = PROTO_V1.replace("string id = 1;", "string id = 1;\n  int32 qty = 3;");
    let (_, v) = api
        .register_json(
            "orders-value",
            json!({"schema": good, "schemaType": "PROTOBUF"}),
        )
        .await;
    assert_eq!(v["id"], 2);
    // Everything survives a restart (the stored text compiles again).
    let api = api.restarted().await;
    assert_eq!(api.get("/schemas/ids/1").await.1["schema"], text);
    assert_eq!(
        api.get("/schemas/ids/1?format=serialized").await.1["schema"].as_str(),
        Some(b64.as_str())
    );
}

#[tokio::test]
async fn a_protobuf_schema_moved_in_from_another_registry_is_the_same_schema_registered_here() {
    use crate::log::SchemaLog;
    use crate::records::{Key, Record, SchemaValue};
    // Another registry's record: its own text, layout and comments included, and its own id.
    let log = MemoryLog::new();
    let moved_in = SchemaValue {
        subject: "orders-value".into(),
        version: 1,
        id: 7,
        schema_type: Some("PROTOBUF".into()),
        references: vec![],
        schema: PROTO_V1.into(),
        deleted: false,
    };
    let key = Key::Schema {
        subject: "orders-value".into(),
        version: 1,
    };
    log.append(vec![Record::new(&key, &moved_in)])
        .await
        .unwrap();
    let api = Api::over(log, Settings::default()).await;
    // Served as it was written there.
    assert_eq!(api.get("/schemas/ids/7").await.1["schema"], PROTO_V1);
    // The same schema in another layout is that schema: its id, no new version.
    let relaid = PROTO_V1
        .replace('\n', " ")
        .replace(" // the order's id", "");
    let body = json!({"schema": relaid, "schemaType": "PROTOBUF"});
    let (s, v) = api.register_json("orders-value", body.clone()).await;
    assert_eq!((s, v["id"].as_i64()), (StatusCode::OK, Some(7)), "{v}");
    assert_eq!(
        api.get("/subjects/orders-value/versions").await.1,
        json!([1])
    );
    let (_, v) = api.register_json("orders-copy", body).await;
    assert_eq!(v["id"], 7);
}

#[tokio::test]
async fn protobuf_imports_resolve_through_references() {
    let api = Api::new().await;
    let address = "syntax = \"proto3\"; package acme; message Address { string city = 1; }";
    let (_, v) = api
        .register_json(
            "address",
            json!({"schema": address, "schemaType": "PROTOBUF"}),
        )
        .await;
    assert_eq!(v["id"], 1);
    let person = "syntax = \"proto3\"; package acme; import \"acme/address.proto\"; message Person { Address home = 1; }";
    let refs = json!([{"name": "acme/address.proto", "subject": "address", "version": 1}]);
    let (s, v) = api
        .register_json(
            "person-value",
            json!({"schema": person, "schemaType": "PROTOBUF", "references": refs}),
        )
        .await;
    assert_eq!((s, v["id"].as_i64()), (StatusCode::OK, Some(2)), "{v}");
    assert_eq!(
        api.get("/subjects/address/versions/1/referencedby").await.1,
        json!([2])
    );
    // Without the reference the import does not resolve.
    let (s, v) = api
        .register_json(
            "person2-value",
            json!({"schema": person, "schemaType": "PROTOBUF"}),
        )
        .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNPROCESSABLE_ENTITY, 42201),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("acme/address.proto"),
        "{v}"
    );
}

#[tokio::test]
async fn record_encoders_register_a_schema_once_and_refuse_a_type_they_are_not() {
    use crate::schema::SchemaType;
    let api = Api::new().await;
    let e = api
        .reg
        .record_encoder("clicks-value", SchemaType::Avro, Some(USER_V1.into()), None)
        .await
        .unwrap();
    assert_eq!(e.id(), 1);
    let out = e.encode_all(&[r#"{"id": 5}"#]).unwrap();
    assert_eq!(out[0], vec![0, 0, 0, 0, 1, 10]);
    // Again with the text, and by id: found, not registered again.
    let again = api
        .reg
        .record_encoder("clicks-value", SchemaType::Avro, Some(USER_V1.into()), None)
        .await
        .unwrap();
    assert_eq!(again.id(), 1);
    assert_eq!(
        api.get("/subjects/clicks-value/versions").await.1,
        json!([1])
    );
    let by_id = api
        .reg
        .record_encoder("other-value", SchemaType::Avro, None, Some(1))
        .await
        .unwrap();
    assert_eq!(by_id.id(), 1);
    let wrong = api
        .reg
        .record_encoder("clicks-value", SchemaType::Protobuf, None, Some(1))
        .await
        .unwrap_err();
    assert_eq!(wrong.error_code(), 42201);
    let unknown = api
        .reg
        .record_encoder("clicks-value", SchemaType::Avro, None, Some(99))
        .await
        .unwrap_err();
    assert_eq!(unknown.error_code(), 40403);
    // An incompatible schema is refused as a registration would be.
    let refused = api
        .reg
        .record_encoder(
            "clicks-value",
            SchemaType::Avro,
            Some(USER_BAD.into()),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(refused.error_code(), 409);
}

#[tokio::test]
async fn a_record_encoder_found_by_text_follows_a_deleted_and_registered_again_subject() {
    use crate::schema::SchemaType;
    let api = Api::new().await;
    let get = |api: &Api| {
        let reg = api.reg.clone();
        async move {
            reg.record_encoder("t-value", SchemaType::Avro, Some(USER_V1.into()), None)
                .await
                .unwrap()
                .id()
        }
    };
    assert_eq!(get(&api).await, 1);
    assert_eq!(get(&api).await, 1);
    // Deleted for good, then posted again: registered anew (a new id), not the stale one.
    api.call("DELETE", "/subjects/t-value", None).await;
    api.call("DELETE", "/subjects/t-value?permanent=true", None)
        .await;
    assert_eq!(
        api.get("/subjects/t-value/versions").await.0,
        StatusCode::NOT_FOUND
    );
    let id = get(&api).await;
    assert_eq!(api.get("/subjects/t-value/versions").await.1, json!([1]));
    assert_eq!(api.get("/subjects/t-value/versions/1").await.1["id"], id);
}

/// A log on a node that does not lead `_schemas`: node 2 does.
struct FollowerLog(Arc<MemoryLog>);

impl crate::log::SchemaLog for FollowerLog {
    fn prepare(&self) -> futures::future::BoxFuture<'static, Result<(), RegistryError>> {
        self.0.prepare()
    }
    fn append(
        &self,
        records: Vec<crate::records::Record>,
    ) -> futures::future::BoxFuture<'static, Result<i64, RegistryError>> {
        self.0.append(records)
    }
    fn read(&self, from: i64) -> Result<crate::log::Chunk, RegistryError> {
        self.0.read(from)
    }
    fn end(&self) -> i64 {
        self.0.end()
    }
    fn changed(&self, limit: std::time::Duration) -> futures::future::BoxFuture<'static, ()> {
        self.0.changed(limit)
    }
    fn writer(&self) -> crate::forward::Writer {
        crate::forward::Writer::Node(2)
    }
}

/// Records what it was asked to forward and answers as the leader would (or fails).
#[derive(Default)]
struct FakeLeader {
    seen: parking_lot::Mutex<Vec<(i32, crate::forward::ForwardRequest)>>,
    down: bool,
}

impl crate::forward::Forward for Arc<FakeLeader> {
    fn forward(
        &self,
        node: i32,
        request: crate::forward::ForwardRequest,
        _limit: std::time::Duration,
    ) -> futures::future::BoxFuture<'static, Result<crate::forward::ForwardAnswer, String>> {
        self.seen.lock().push((node, request));
        let down = self.down;
        Box::pin(async move {
            if down {
                return Err("connection refused".to_string());
            }
            Ok(crate::forward::ForwardAnswer {
                status: 200,
                content_type: Some(axum::http::HeaderValue::from_static(CT)),
                applied: None,
                body: bytes::Bytes::from_static(br#"{"id":7}"#),
            })
        })
    }
}

async fn send_to(app: axum::Router, req: Request<Body>) -> (StatusCode, Value, Option<String>) {
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ct,
    )
}

async fn follower(leader: Arc<FakeLeader>) -> (Arc<Registry>, axum::Router) {
    let reg = Registry::start(
        Arc::new(FollowerLog(MemoryLog::new())),
        Settings {
            max_body_bytes: 1000,
            ..Settings::default()
        },
    )
    .await;
    let hooks = crate::api::Hooks {
        access: None,
        forward: Some(Arc::new(leader)),
    };
    (reg.clone(), crate::api::router_with(reg, hooks))
}

#[tokio::test]
async fn a_write_off_the_leader_is_forwarded_with_its_query_body_type_and_credentials_and_the_answer_relayed(
) {
    let leader = Arc::new(FakeLeader::default());
    let (reg, app) = follower(leader.clone()).await;
    let req = Request::post("/subjects/s-value/versions?normalize=true")
        .header("content-type", "application/json")
        .header("authorization", "Basic YTpi")
        .body(Body::from(r#"{"schema":"\"long\""}"#))
        .unwrap();
    let (status, v, ct) = send_to(app.clone(), req).await;
    assert_eq!(
        (status, v, ct.as_deref()),
        (StatusCode::OK, json!({"id": 7}), Some(CT))
    );
    let (node, fwd) = leader.seen.lock()[0].clone();
    assert_eq!(node, 2);
    assert_eq!(fwd.method, axum::http::Method::POST);
    assert_eq!(
        fwd.path_and_query,
        "/subjects/s-value/versions?normalize=true"
    );
    assert_eq!(fwd.content_type.as_ref().unwrap(), "application/json");
    assert_eq!(fwd.authorization.as_ref().unwrap(), "Basic YTpi");
    assert_eq!(&fwd.body[..], br#"{"schema":"\"long\""}"#);
    assert_eq!(reg.metrics.forwarded.get(), 1);
    // Reads and lookups are answered here.
    let (status, _, _) = send_to(
        app.clone(),
        Request::get("/subjects").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let lookup = Request::post("/subjects/s-value")
        .header("content-type", CT)
        .body(Body::from(r#"{"schema":"\"long\""}"#))
        .unwrap();
    let (status, v, _) = send_to(app, lookup).await;
    assert_eq!((status, code(&v)), (StatusCode::NOT_FOUND, 40401));
    assert_eq!(leader.seen.lock().len(), 1);
}

#[tokio::test]
async fn a_write_forwarded_once_already_is_refused_with_50003_not_forwarded_again() {
    let leader = Arc::new(FakeLeader::default());
    let (_, app) = follower(leader.clone()).await;
    let req = Request::put("/config")
        .header("content-type", CT)
        .header(crate::forward::FORWARDED_HEADER, "1")
        .body(Body::from(r#"{"compatibility":"NONE"}"#))
        .unwrap();
    let (status, v, _) = send_to(app, req).await;
    assert_eq!((status.as_u16(), code(&v)), (500, 50003), "{v}");
    assert!(leader.seen.lock().is_empty());
}

#[tokio::test]
async fn a_forwarded_body_over_the_limit_is_413_and_a_leader_that_does_not_answer_is_50003() {
    let leader = Arc::new(FakeLeader::default());
    let (_, app) = follower(leader.clone()).await;
    let big = format!(r#"{{"schema":"{}"}}"#, "x".repeat(2000));
    let req = Request::post("/subjects/s/versions")
        .header("content-type", CT)
        .body(Body::from(big))
        .unwrap();
    let (status, v, _) = send_to(app, req).await;
    assert_eq!((status.as_u16(), code(&v)), (413, 413));
    assert!(leader.seen.lock().is_empty());

    let down = Arc::new(FakeLeader {
        down: true,
        ..FakeLeader::default()
    });
    let (reg, app) = follower(down).await;
    let req = Request::delete("/subjects/s").body(Body::empty()).unwrap();
    let (status, v, _) = send_to(app, req).await;
    assert_eq!((status.as_u16(), code(&v)), (500, 50003), "{v}");
    assert!(v["message"].as_str().unwrap().contains("node 2"), "{v}");
    assert_eq!(reg.metrics.forward_failures.get(), 1);
}

/// Users "alice" (Describe and Write on topic orders, Describe on topic shared, nothing on
/// the cluster), "bob" (nothing) and "admin" (everything), named in the Authorization header
/// as they are.
struct FakeAcls;

impl crate::access::Access for FakeAcls {
    fn authenticate(
        &self,
        headers: &axum::http::HeaderMap,
        _peer: Option<std::net::IpAddr>,
    ) -> Result<crate::access::Caller, String> {
        let user = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .filter(|u| ["alice", "bob", "admin"].contains(u))
            .ok_or("who are you")?;
        let session = spate_broker::security::Session::new(
            spate_broker::security::SecurityProtocol::Plaintext,
            None,
            Some(spate_auth::Principal::user(user.to_string())),
        );
        Ok(crate::access::Caller(Some(Arc::new(session))))
    }

    fn allows(
        &self,
        caller: &crate::access::Caller,
        operation: spate_auth::acl::Operation,
        resource_type: spate_auth::acl::ResourceType,
        name: &str,
    ) -> bool {
        use spate_auth::acl::{Operation, ResourceType};
        let who = caller.name();
        let alice = |topic, ops: &[Operation]| {
            who == "User:alice"
                && resource_type == ResourceType::Topic
                && name == topic
                && ops.contains(&operation)
        };
        who == "User:admin"
            || alice("orders", &[Operation::Describe, Operation::Write])
            || alice("shared", &[Operation::Describe])
    }
}

/// The API of a fresh registry whose callers are checked by [`FakeAcls`].
async fn secured_app() -> axum::Router {
    let reg = Registry::start(Arc::new(MemoryLog::new()), Settings::default()).await;
    crate::api::router_with(
        reg,
        crate::api::Hooks {
            access: Some(Arc::new(FakeAcls)),
            forward: None,
        },
    )
}

#[tokio::test]
async fn with_security_callers_need_credentials_and_the_acls_of_the_subjects_topic() {
    let app = secured_app().await;
    let call = |method: &str, path: &str, user: Option<&str>, body: Option<Value>| {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(u) = user {
            req = req.header("authorization", u);
        }
        let req = match body {
            Some(b) => req
                .header("content-type", CT)
                .body(Body::from(b.to_string())),
            None => req.body(Body::empty()),
        }
        .unwrap();
        send_to(app.clone(), req)
    };
    let schema = json!({"schema": "\"long\""});
    let (status, v, _) = call("GET", "/subjects", None, None).await;
    assert_eq!((status.as_u16(), code(&v)), (401, 40101));
    let (status, v, _) = call("GET", "/subjects", Some("mallory"), None).await;
    assert_eq!((status.as_u16(), code(&v)), (401, 40101));
    let register = "/subjects/orders-value/versions";
    let (status, v, _) = call("POST", register, Some("bob"), Some(schema.clone())).await;
    assert_eq!((status.as_u16(), code(&v)), (403, 40301), "{v}");
    let (status, v, _) = call("POST", register, Some("alice"), Some(schema.clone())).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let id = v["id"].as_i64().unwrap();
    // Lists show what the caller may describe; ids need a subject the caller may describe.
    let (_, v, _) = call("GET", "/subjects", Some("alice"), None).await;
    assert_eq!(v, json!(["orders-value"]));
    let (_, v, _) = call("GET", "/subjects", Some("bob"), None).await;
    assert_eq!(v, json!([]));
    let by_id = format!("/schemas/ids/{id}");
    let (status, _, _) = call("GET", &by_id, Some("alice"), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, v, _) = call("GET", &by_id, Some("bob"), None).await;
    assert_eq!((status.as_u16(), code(&v)), (403, 40301));
    let (status, v, _) = call(
        "GET",
        "/subjects/orders-value/versions/1",
        Some("bob"),
        None,
    )
    .await;
    assert_eq!((status.as_u16(), code(&v)), (403, 40301));
    // Deleting needs Delete, the global config AlterConfigs on the cluster: alice has neither.
    let (status, _, _) = call("DELETE", "/subjects/orders-value", Some("alice"), None).await;
    assert_eq!(status.as_u16(), 403);
    let nconf = json!({"compatibility": "NONE"});
    let (status, _, _) = call("PUT", "/config", Some("alice"), Some(nconf)).await;
    assert_eq!(status.as_u16(), 403);
    let (status, _, _) = call("GET", "/config", Some("bob"), None).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_schema_with_references_needs_describe_on_each_referenced_subject() {
    let app = secured_app().await;
    let call = |method: &str, path: &str, user: &str, body: Value| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", user)
            .header("content-type", CT)
            .body(Body::from(body.to_string()))
            .unwrap();
        send_to(app.clone(), req)
    };
    let record = |name: &str, field: Value| {
        json!({"type": "record", "name": name, "fields": [{"name": "f", "type": field}]})
            .to_string()
    };
    for (subject, name) in [("shared-value", "Shared"), ("secret-value", "Secret")] {
        let body = json!({"schema": record(name, json!("long"))});
        let path = format!("/subjects/{subject}/versions");
        let (status, v, _) = call("POST", &path, "admin", body).await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let using = |name: &str| {
        json!({
            "schema": record("Order", json!(name)),
            "references": [{"name": name, "subject": format!("{}-value", name.to_lowercase()), "version": 1}],
        })
    };
    // alice may write orders-value, but not build on a subject whose topic she cannot see:
    // not to register, not to look up, not to test compatibility.
    for (method, path) in [
        ("POST", "/subjects/orders-value/versions"),
        ("POST", "/subjects/orders-value"),
        ("POST", "/compatibility/subjects/orders-value/versions"),
        (
            "POST",
            "/compatibility/subjects/orders-value/versions/latest",
        ),
    ] {
        let (status, v, _) = call(method, path, "alice", using("Secret")).await;
        assert_eq!((status.as_u16(), code(&v)), (403, 40301), "{path}: {v}");
        let message = v["message"].as_str().unwrap();
        assert!(message.contains("'secret-value'"), "{path}: {message}");
    }
    // A reference to a subject she may describe is taken, and then found by lookup.
    let (status, v, _) = call(
        "POST",
        "/subjects/orders-value/versions",
        "alice",
        using("Shared"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v, _) = call("POST", "/subjects/orders-value", "alice", using("Shared")).await;
    assert_eq!(
        (status, v["version"].clone()),
        (StatusCode::OK, json!(1)),
        "{v}"
    );
}

#[tokio::test]
async fn the_status_says_who_takes_writes_and_what_the_registry_holds() {
    let api = Api::new().await;
    api.register("a", "\"long\"").await;
    api.register("b", "\"string\"").await;
    let st = api.reg.status();
    assert!(st.leader);
    assert_eq!((st.subjects, st.schemas, st.next_id), (2, 2, 3));
    assert_eq!((st.mode, st.compatibility), ("READWRITE", "BACKWARD"));
    let (reg, _) = follower(Arc::new(FakeLeader::default())).await;
    let st = reg.status();
    assert_eq!((st.leader, st.writer), (false, Some(2)));
}

#[tokio::test]
async fn the_leader_tells_a_forwarding_node_how_far_to_read_and_the_node_reads_that_far() {
    // The leader: a forwarded write is answered with the offset its registry applied.
    let reg = Registry::start(Arc::new(MemoryLog::new()), Settings::default()).await;
    let write = |forwarded: bool| {
        let mut req = Request::post("/subjects/s-value/versions").header("content-type", CT);
        if forwarded {
            req = req.header(crate::forward::FORWARDED_HEADER, "2");
        }
        req.body(Body::from(r#"{"schema":"\"long\""}"#)).unwrap()
    };
    let resp = crate::router(reg.clone())
        .oneshot(write(true))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let applied: i64 = resp.headers()[crate::forward::APPLIED_HEADER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(applied > 0 && applied == reg.applied_offset(), "{applied}");
    // A client's own write carries no such header.
    let resp = crate::router(reg.clone())
        .oneshot(write(false))
        .await
        .unwrap();
    assert!(!resp.headers().contains_key(crate::forward::APPLIED_HEADER));
    // A node already that far returns at once; one that cannot get there says so.
    reg.await_applied(applied).await.unwrap();
    let short = Registry::start(
        Arc::new(MemoryLog::new()),
        Settings {
            write_timeout: std::time::Duration::from_millis(50),
            ..Settings::default()
        },
    )
    .await;
    assert!(matches!(
        short.await_applied(applied).await,
        Err(RegistryError::Timeout(_))
    ));
}
