use super::*;

fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

#[tokio::test]
async fn a_directory_registry_answers_confluent_and_glue_ids() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("7.avsc"), r#""string""#).expect("write");
    let uuid = uuid::Uuid::from_u128(42);
    std::fs::write(dir.path().join(format!("{uuid}.avsc")), r#""long""#).expect("write");
    let spec = RegistrySpec {
        url: Some(format!("file:{}", dir.path().display())),
    };
    let r = Registries::configure(&spec, env(&[]), None).expect("registries");
    assert_eq!(
        r.fetch(&SchemaId::Confluent(7)).await.expect("fetch"),
        Lookup::Found {
            schema: r#""string""#.into(),
            kind: "AVRO".into()
        }
    );
    assert_eq!(
        r.fetch(&SchemaId::Glue(uuid)).await.expect("fetch"),
        Lookup::Found {
            schema: r#""long""#.into(),
            kind: "AVRO".into()
        }
    );
    let Lookup::Missing(why) = r.fetch(&SchemaId::Confluent(8)).await.expect("fetch") else {
        panic!("id 8 is not there");
    };
    assert!(why.contains("8.avsc"), "{why}");
}

#[tokio::test]
async fn the_environment_overrides_the_spec_and_no_registry_is_a_reason_not_a_fault() {
    let spec = RegistrySpec {
        url: Some("file:/nonexistent".into()),
    };
    let r = Registries::configure(&spec, env(&[(URL_ENV, "http://127.0.0.1:9")]), None)
        .expect("registries");
    assert!(format!("{r:?}").contains("http://127.0.0.1:9"), "{r:?}");
    // Nothing listens on port 9: a fault the batch is retried for, not a missing schema.
    let e = r
        .fetch(&SchemaId::Confluent(1))
        .await
        .expect_err("unreachable");
    assert!(e.is_retryable(), "{e}");
    // No Glue registry: Glue-framed records are dead letters that say what to configure.
    let Lookup::Missing(why) = r
        .fetch(&SchemaId::Glue(uuid::Uuid::nil()))
        .await
        .expect("no source is an answer")
    else {
        panic!("missing");
    };
    assert!(why.contains("AWS backend"), "{why}");
    let none = Registries::configure(&RegistrySpec::default(), env(&[]), None).expect("none");
    let Lookup::Missing(why) = none.fetch(&SchemaId::Confluent(3)).await.expect("answer") else {
        panic!("missing");
    };
    assert!(why.contains("STREAMTABLE_REGISTRY_URL"), "{why}");
}

#[test]
fn credentials_must_be_key_and_secret() {
    let e = ConfluentRegistry::new("http://127.0.0.1:1", Some("no-colon")).expect_err("bad auth");
    assert!(e.to_string().contains("key:secret"), "{e}");
    let e = ConfluentRegistry::new("https://key:secret@sr.example.com/x", None)
        .expect_err("credentials in the URL");
    assert!(
        e.to_string().contains("STREAMTABLE_REGISTRY_AUTH") && !e.to_string().contains("secret@"),
        "{e}"
    );
    let e = ConfluentRegistry::new("ftp://x", None).expect_err("bad scheme");
    assert!(e.to_string().contains("https://"), "{e}");
}
