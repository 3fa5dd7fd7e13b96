use super::*;

const RR: &str = "some-remote-registry";
const PREFIX: &str =
    r#"RemoteRegistry.connectivity.tanzu.vmware.com "some-remote-registry" is invalid: "#;

fn labels(sizes: &[usize]) -> String {
    let letters = ['a', 'b', 'c', 'd', 'e'];
    sizes
        .iter()
        .zip(letters.iter().cycle())
        .map(|(n, c)| c.to_string().repeat(*n))
        .collect::<Vec<_>>()
        .join(".")
}

/// The validation result with the error as its message (what the condition carries).
fn validate(domains: &[&str]) -> Result<(), String> {
    let owned: Vec<String> = domains.iter().map(|d| d.to_string()).collect();
    validate_allowed_domains(RR, &owned).map_err(|e| e.to_string())
}

/// (case id, allowedDomains, substrings the error must contain; `None` = valid).
type Case<'a> = (&'a str, Vec<String>, Option<&'a [&'a str]>);

/// XCC v1's own `allowedDomains` cases, numbered in its order, one-element lists except #26.
/// `None` = valid, `Some(s)` = the error message contains `s` (and nothing of the other rules).
#[test]
fn xcc_v1_allowed_domains_cases() {
    let l255 = labels(&[60, 60, 60, 60, 11]);
    let l256 = labels(&[60, 60, 60, 60, 12]);
    let cases: Vec<Case> = vec![
        ("#01", vec![".".into()], None),
        ("#02", vec!["tld".into()], None),
        ("#03", vec!["tld.".into()], None),
        ("#04", vec!["example.com".into()], None),
        ("#05", vec!["123.local".into()], None),
        ("#06", vec![l256.clone()], Some(&["Too long"])),
        ("#07", vec![l255.clone()], None),
        ("#08", vec![format!("{l255}.")], None),
        ("#09", vec!["".into()], Some(&["Invalid domain"])),
        (
            "#10",
            vec![format!("{}.example.com", "a".repeat(64))],
            Some(&["Invalid domain"]),
        ),
        (
            "#11",
            vec!["example..com".into()],
            Some(&["Invalid domain"]),
        ),
        ("#12", vec![format!("{}.example.com", "a".repeat(63))], None),
        (
            "#13",
            vec!["http://example.com".into()],
            Some(&["Invalid characters"]),
        ),
        (
            "#14",
            vec!["example.com/path".into()],
            Some(&["Invalid characters"]),
        ),
        (
            "#15",
            vec!["example domain.com".into()],
            Some(&["Invalid characters"]),
        ),
        (
            "#16",
            vec!["\\123example.com".into()],
            Some(&["Invalid characters"]),
        ),
        (
            "#17",
            vec!["你好.com".into()],
            Some(&["Invalid characters"]),
        ),
        ("#18", vec!["xn--6qq79v.com".into()], None),
        (
            "#19",
            vec!["example.-domain.com".into()],
            Some(&["Invalid use of hyphen"]),
        ),
        (
            "#20",
            vec!["example-.domain.com".into()],
            Some(&["Invalid use of hyphen"]),
        ),
        (
            "#21",
            vec!["example.-domain-.com".into()],
            Some(&["Invalid use of hyphen"]),
        ),
        ("#22", vec!["example-domain.com".into()], None),
        ("#23", vec!["123".into()], Some(&["Invalid TLD"])),
        ("#24", vec!["example.123".into()], Some(&["Invalid TLD"])),
        ("#25", vec!["example.123.".into()], Some(&["Invalid TLD"])),
        (
            "#26",
            vec!["example domain.com".into(), "example.-domain.com".into()],
            Some(&["Invalid characters", "Invalid use of hyphen"]),
        ),
    ];
    assert_eq!(l255.len(), 255);
    assert_eq!(l256.len(), 256);
    let rules = [
        "Too long",
        "Invalid domain",
        "Invalid characters",
        "Invalid use of hyphen",
        "Invalid TLD",
    ];
    for (id, domains, expected) in cases {
        let result = validate_allowed_domains(RR, &domains);
        match expected {
            None => assert_eq!(result, Ok(()), "{id}"),
            Some(wanted) => {
                let error = result.expect_err(id);
                assert_eq!(error.name, RR, "{id}");
                assert_eq!(error.errors.len(), domains.len(), "{id}");
                let message = error.to_string();
                assert!(message.starts_with(PREFIX), "{id}: {message}");
                for rule in rules {
                    assert_eq!(
                        message.contains(rule),
                        wanted.contains(&rule),
                        "{id}: rule {rule:?} in {message}"
                    );
                }
            }
        }
    }
}

#[test]
fn full_messages() {
    assert_eq!(
        validate(&[""]).unwrap_err(),
        format!("{PREFIX}spec.allowedDomains[0]: Required value: {INVALID_DOMAIN_DETAIL}")
    );
    assert_eq!(
        validate(&[&labels(&[60, 60, 60, 60, 12])]).unwrap_err(),
        format!("{PREFIX}spec.allowedDomains[0]: Too long: must have at most 255 bytes")
    );
    assert_eq!(
        validate(&["example..com"]).unwrap_err(),
        format!(
            "{PREFIX}spec.allowedDomains[0]: Invalid value: \"example..com\": Invalid domain. For example, labels in the domain name must have between 1 and 63 characters. Check RFC1035 for more details."
        )
    );
    assert_eq!(
        validate(&["\\123example.com"]).unwrap_err(),
        format!(
            "{PREFIX}spec.allowedDomains[0]: Invalid value: \"\\\\123example.com\": Invalid characters. Domain names must contain only alphanumeric characters, or dots (.) and hyphens (-)."
        )
    );
    assert_eq!(
        validate(&["你好.com"]).unwrap_err(),
        format!(
            "{PREFIX}spec.allowedDomains[0]: Invalid value: \"你好.com\": {INVALID_CHARACTERS_DETAIL}"
        )
    );
    assert_eq!(
        validate(&["example.123."]).unwrap_err(),
        format!(
            "{PREFIX}spec.allowedDomains[0]: Invalid value: \"example.123.\": Invalid TLD. All-numeric TLDs are invalid."
        )
    );
    assert_eq!(
        validate(&["example domain.com", "example.-domain.com"]).unwrap_err(),
        format!(
            "{PREFIX}[spec.allowedDomains[0]: Invalid value: \"example domain.com\": Invalid characters. Domain names must contain only alphanumeric characters, or dots (.) and hyphens (-)., spec.allowedDomains[1]: Invalid value: \"example.-domain.com\": Invalid use of hyphen in label. Labels in a domain name must not start or end with `-`.]"
        )
    );
}

#[test]
fn valid_entries_do_not_hide_invalid_ones_and_indices_follow_the_list() {
    assert_eq!(
        validate(&["ok.example", "bad..example", "fine", "123"]).unwrap_err(),
        format!(
            "{PREFIX}[spec.allowedDomains[1]: Invalid value: \"bad..example\": {INVALID_DOMAIN_DETAIL}, spec.allowedDomains[3]: Invalid value: \"123\": {INVALID_TLD_DETAIL}]"
        )
    );
    assert_eq!(validate(&[]), Ok(()));
}

#[test]
fn miekg_quirks() {
    // A single leading dot is an empty first label, accepted.
    assert_eq!(validate(&[".com"]), Ok(()));
    assert!(
        validate(&["..com"])
            .unwrap_err()
            .contains(INVALID_DOMAIN_DETAIL)
    );
    // 60,60,60,60,12 plus a trailing dot is 257 bytes: over the wire limit and over 255 → Too long.
    let too_long = format!("{}.", labels(&[60, 60, 60, 60, 12]));
    assert!(
        validate(&[&too_long])
            .unwrap_err()
            .ends_with("Too long: must have at most 255 bytes")
    );
    // Over 255 bytes wins over the actual cause (here an empty label).
    let long_with_gap = format!("{}..com", "a.".repeat(140));
    assert!(
        validate(&[&long_with_gap])
            .unwrap_err()
            .ends_with("Too long: must have at most 255 bytes")
    );
    // A 64-octet label in a short name is `Invalid domain`, not `Too long`.
    assert!(
        validate(&[&"a".repeat(64)])
            .unwrap_err()
            .contains(INVALID_DOMAIN_DETAIL)
    );
    // Hyphen rule checked before the TLD rule; the root has no labels.
    assert!(
        validate(&["-.123"])
            .unwrap_err()
            .contains(INVALID_HYPHEN_DETAIL)
    );
    assert!(
        validate(&["1.2.3.4"])
            .unwrap_err()
            .contains(INVALID_TLD_DETAIL)
    );
    assert_eq!(validate(&["UPPER.Case.COM"]), Ok(()));
}

#[test]
fn rr_name_is_go_quoted() {
    let errors = vec![FieldError {
        path: "spec.allowedDomains[0]".into(),
        kind: FieldErrorKind::TooLong { max: 255 },
    }];
    assert_eq!(
        invalid_error_message(
            "RemoteRegistry.connectivity.tanzu.vmware.com",
            "a\"b\n",
            &errors
        ),
        "RemoteRegistry.connectivity.tanzu.vmware.com \"a\\\"b\\n\" is invalid: spec.allowedDomains[0]: Too long: must have at most 255 bytes"
    );
}

#[test]
fn aggregate_drops_duplicate_texts() {
    let e = FieldError {
        path: "p".into(),
        kind: FieldErrorKind::Required {
            detail: String::new(),
        },
    };
    assert_eq!(
        invalid_error_message("K.g", "n", &[e.clone(), e.clone()]),
        "K.g \"n\" is invalid: p: Required value"
    );
    let other = FieldError {
        path: "q".into(),
        kind: FieldErrorKind::Required { detail: "d".into() },
    };
    assert_eq!(
        invalid_error_message("K.g", "n", &[e.clone(), other, e]),
        "K.g \"n\" is invalid: [p: Required value, q: Required value: d]"
    );
}

#[test]
fn go_quote_matches_strconv_quote() {
    let cases = [
        ("plain", r#""plain""#),
        ("q\"b\\s", r#""q\"b\\s""#),
        ("\u{7}\u{8}\u{c}\n\r\t\u{b}", r#""\a\b\f\n\r\t\v""#),
        ("\u{0}\u{1b}\u{7f}", r#""\x00\x1b\x7f""#),
        ("你好 é", "\"你好 é\""),
        ("\u{a0}\u{200b}\u{feff}", r#""\u00a0\u200b\ufeff""#),
        ("\u{e000}\u{f0000}", r#""\ue000\U000f0000""#),
        ("😀", "\"😀\""),
    ];
    for (input, expected) in cases {
        assert_eq!(go_quote(input), expected, "{input:?}");
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

const RC06_STATE: [&str; 7] = [
    "some-service.some.domain",
    "other.some.domain",
    "other.somesome.domain",
    "some.other.domain",
    "domain.with.dot.at.end.",
    "domain.WITH.mixed.case",
    "yet.another.domain",
];

fn allowed_subset(allowed: &[&str]) -> Vec<&'static str> {
    let allowed = strings(allowed);
    RC06_STATE
        .iter()
        .copied()
        .filter(|fqdn| fqdn_allowed(fqdn, &allowed))
        .collect()
}

#[test]
fn rc06_empty_list_allows_everything() {
    assert_eq!(allowed_subset(&[]), RC06_STATE.to_vec());
}

#[test]
fn rc07_some_domain_only() {
    assert_eq!(
        allowed_subset(&["some.domain"]),
        vec!["some-service.some.domain", "other.some.domain"]
    );
}

#[test]
fn rc08_mixed_entries() {
    assert_eq!(
        allowed_subset(&[
            "some.domain",
            "some.other.domain",
            "domain.with.dot.at.end.",
            "domain.with.MIXED.case",
        ]),
        vec![
            "some-service.some.domain",
            "other.some.domain",
            "some.other.domain",
            "domain.with.dot.at.end.",
            "domain.WITH.mixed.case",
        ]
    );
}

#[test]
fn matching_is_label_wise() {
    let some = strings(&["some.domain"]);
    assert!(!fqdn_allowed("other.somesome.domain", &some));
    assert!(fqdn_allowed("some.domain", &some));
    assert!(fqdn_allowed("SOME.DOMAIN.", &some));
    assert!(fqdn_allowed("a.b.some.domain", &some));
    assert!(!fqdn_allowed("domain", &some));
    assert!(!fqdn_allowed("", &some));
    assert!(!fqdn_allowed("some.domain.evil", &some));
    // An escaped dot does not separate labels (miekg `Split`).
    assert!(!fqdn_allowed(
        "x\\.some.domain",
        &strings(&["x.some.domain"])
    ));
    assert!(!fqdn_allowed("x\\.some.domain", &some));
    assert!(fqdn_allowed("a.x\\.y.some.domain", &some));
    assert!(!fqdn_allowed("xsome\\.domain", &some));
}

#[test]
fn root_allows_everything() {
    let root = strings(&["."]);
    for fqdn in ["", ".", "a", "a.b.c.", "Mixed.Case"] {
        assert!(fqdn_allowed(fqdn, &root), "{fqdn:?}");
    }
}

#[test]
fn leading_dot_entry_is_an_empty_label() {
    let entry = strings(&[".com"]);
    assert!(!fqdn_allowed("x.com", &entry));
    assert!(fqdn_allowed(".com", &entry));
}
