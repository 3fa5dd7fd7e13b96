use super::*;
use crate::pki::{Ca, IssueRequest, write_issued};

fn errors(tls: &ReloadingTls) -> u64 {
    tls.inner
        .metrics
        .reloads
        .get_or_create(&[("result", "error")])
        .get()
}

#[test]
fn watcher_reports_a_broken_file_once_but_reload_now_always_revalidates() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let ca = Ca::generate("xcc.test").expect("CA");
    let issued = ca.issue(&IssueRequest::cluster("west")).expect("issue");
    let files = write_issued(dir.path(), &ca, &issued).expect("write");
    let tls = ReloadingTls::load(files.clone()).expect("load");

    std::fs::write(&files.key, "garbage").expect("write");
    assert!(matches!(
        tls.reload_if_changed(),
        Err(CertError::NoPrivateKey { .. })
    ));
    assert!(
        matches!(tls.reload_if_changed(), Ok(false)),
        "same input skipped"
    );
    assert_eq!(errors(&tls), 1);
    assert!(matches!(
        tls.reload_now(),
        Err(CertError::NoPrivateKey { .. })
    ));
    assert_eq!(errors(&tls), 2);

    std::fs::remove_file(&files.key).expect("remove");
    assert!(matches!(tls.reload_if_changed(), Err(CertError::Io { .. })));
    assert!(
        matches!(tls.reload_if_changed(), Ok(false)),
        "same read error skipped"
    );
    assert_eq!(errors(&tls), 3);

    // Back to the material in service: nothing to do, and the failure memory is cleared...
    std::fs::write(&files.key, &issued.key_pem).expect("write");
    assert!(matches!(tls.reload_if_changed(), Ok(false)));
    // ...so the same breakage later is reported again.
    std::fs::write(&files.key, "garbage").expect("write");
    assert!(matches!(
        tls.reload_if_changed(),
        Err(CertError::NoPrivateKey { .. })
    ));
    assert_eq!(errors(&tls), 4);
    assert_eq!(tls.current().generation, 1);
}

/// Each CA of the bundle has its expiry series; the earliest one is warned about once per
/// state as its end comes near, then reported expired.
#[test]
fn each_ca_of_the_bundle_is_watched_for_expiry() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let (old, new) = (
        Ca::generate("xcc.test").expect("CA"),
        Ca::generate("xcc.test").expect("CA"),
    );
    let issued = old.issue(&IssueRequest::cluster("west")).expect("issue");
    let files = write_issued(dir.path(), &old, &issued).expect("write");
    std::fs::write(&files.ca, format!("{}{}", old.cert_pem(), new.cert_pem())).expect("write");
    let tls = ReloadingTls::load(files).expect("load");

    let mut registry = Registry::default();
    tls.register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("xcc_ca_certificate_expiry_timestamp_seconds{"))
        .collect();
    assert_eq!(series.len(), 2, "{text}");
    let cas = ca_validity(&tls.current().ca_certs);
    // The family's order is its own: find each CA's series by its serial.
    for ca in &cas {
        let line = series
            .iter()
            .find(|l| l.contains(&format!("serial=\"{}\"", ca.serial)))
            .unwrap_or_else(|| panic!("no series for {}: {text}", ca.serial));
        assert!(
            line.ends_with(&format!(" {}", ca.not_after.unix_timestamp())),
            "{line}"
        );
    }

    let first = cas.iter().map(|c| c.not_after).min().expect("a CA");
    let day = time::Duration::days(1);
    assert_eq!(
        tls.check_ca_expiry(first - day * 400),
        None,
        "valid: nothing said"
    );
    assert_eq!(tls.check_ca_expiry(first - day), Some(Expiry::Soon));
    assert_eq!(tls.check_ca_expiry(first - day), None, "said once");
    assert_eq!(tls.check_ca_expiry(first), Some(Expiry::Expired));
}

#[test]
fn expiry_warns_within_a_third_of_the_lifetime_between_7_and_30_days() {
    let t0 = time::OffsetDateTime::UNIX_EPOCH;
    let day = time::Duration::days(1);
    // A 90-day certificate: warned 30 days ahead (a third), expired at notAfter.
    let (from, to) = (t0, t0 + day * 90);
    assert_eq!(expiry_at(from, to, t0 + day * 59), Expiry::Valid);
    assert_eq!(expiry_at(from, to, t0 + day * 60), Expiry::Soon);
    assert_eq!(
        expiry_at(from, to, to - time::Duration::SECOND),
        Expiry::Soon
    );
    assert_eq!(expiry_at(from, to, to), Expiry::Expired);
    // A year: the warning is capped at 30 days.
    let to = t0 + day * 365;
    assert_eq!(expiry_at(t0, to, to - day * 31), Expiry::Valid);
    assert_eq!(expiry_at(t0, to, to - day * 30), Expiry::Soon);
    // A 15-day certificate: a third would be 5 days; warned 7 days ahead.
    let to = t0 + day * 15;
    assert_eq!(expiry_at(t0, to, t0 + day * 7), Expiry::Valid);
    assert_eq!(expiry_at(t0, to, t0 + day * 8), Expiry::Soon);
    assert_eq!(next_expiry_change(t0, to, t0), Some(t0 + day * 8));
    assert_eq!(next_expiry_change(t0, to, t0 + day * 8), Some(to));
    assert_eq!(next_expiry_change(t0, to, to), None);
    // A certificate that lives two minutes is reported 50 s before its end (a third of its
    // lifetime would have said nothing until 40 s before).
    let to = t0 + time::Duration::minutes(2);
    assert_eq!(
        expiry_at(t0, to, to - time::Duration::seconds(50)),
        Expiry::Soon
    );
}

/// A certificate 50 s from its expiry is reported at load, and the watcher's next wake-up is
/// its expiry (not its next poll, which may come after it).
#[test]
fn a_certificate_close_to_its_end_is_reported_at_load_and_when_it_expires() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let ca = Ca::generate("xcc.test").expect("CA");
    let now = time::OffsetDateTime::now_utc();
    let mut req = IssueRequest::cluster("west");
    req.not_before = Some(now - time::Duration::seconds(10));
    req.not_after = Some(now + time::Duration::seconds(50));
    let issued = ca.issue(&req).expect("issue");
    let files = write_issued(dir.path(), &ca, &issued).expect("write");
    let tls = ReloadingTls::load(files).expect("load");
    assert_eq!(
        *tls.inner.expiry_reported.lock().expect("lock"),
        Some((1, Expiry::Soon)),
        "reported at load"
    );
    let wait = tls
        .until_next_expiry_change(now)
        .expect("a change is due: the expiry");
    assert!(
        wait > Duration::from_secs(45) && wait <= Duration::from_secs(51),
        "{wait:?}"
    );
    assert_eq!(
        tls.check_expiry(now + time::Duration::seconds(50)),
        Some(Expiry::Expired),
        "what the watcher finds when it wakes then"
    );
}

#[test]
fn expiry_is_reported_at_load_and_once_per_state() {
    let dir = tempfile::TempDir::new().expect("temp dir");
    let ca = Ca::generate("xcc.test").expect("CA");
    let now = time::OffsetDateTime::now_utc();
    let mut req = IssueRequest::cluster("west");
    req.not_before = Some(now - time::Duration::hours(10));
    req.not_after = Some(now + time::Duration::hours(1));
    let issued = ca.issue(&req).expect("issue");
    let files = write_issued(dir.path(), &ca, &issued).expect("write");
    let tls = ReloadingTls::load(files).expect("load");
    // Reported by load already (Soon); not again for the same generation and state.
    assert_eq!(tls.check_expiry(now), None);
    assert_eq!(
        *tls.inner.expiry_reported.lock().expect("lock"),
        Some((1, Expiry::Soon))
    );
    let later = now + time::Duration::hours(2);
    assert_eq!(tls.check_expiry(later), Some(Expiry::Expired));
    assert_eq!(tls.check_expiry(later), None);
}
