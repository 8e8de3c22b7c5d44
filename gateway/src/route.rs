//! Which request paths approxy serves or forwards: its own routes, the policy's extra ones,
//! and paths that could resolve somewhere else upstream (refused on every route).

use axum::http::Method;

/// The routes passthrough forwards besides chat and completions (which their handlers forward
/// when they decide to): `METHOD /path`, where a path ending in `/*` covers everything below
/// it. Anything else is refused, so the target's other routes (llama.cpp's `/slots`, vLLM's
/// admin routes, a provider's files and batches) are not reachable with the operator's key
/// unless the policy adds them (`passthrough.extra_routes`).
pub const SERVED_ROUTES: [&str; 4] = [
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "GET /v1/models",
    "GET /v1/models/*",
];

/// Whether `method path` is served: one of [`SERVED_ROUTES`] or of the policy's `extra`.
pub fn route_allowed(method: &Method, path: &str, extra: &[String]) -> bool {
    methods_served(path, extra).any(|m| m == method.as_str())
}

/// The methods `path` is served with, by [`SERVED_ROUTES`] and the policy's `extra`: a path
/// served with others than the request's is a 405 naming them, not a 404.
pub fn methods_served<'a>(path: &'a str, extra: &'a [String]) -> impl Iterator<Item = &'a str> {
    SERVED_ROUTES
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
        .filter_map(move |route| {
            let (m, pattern) = route.split_once(' ')?;
            let matches = match pattern.strip_suffix("/*") {
                Some(prefix) => path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.len() > 1 && rest.starts_with('/')),
                None => path == pattern,
            };
            matches.then_some(m)
        })
}

/// A path that could resolve somewhere else upstream: `.` or `..` segments, their
/// percent-encoded forms, encoded slashes or backslashes, or empty segments.
pub fn has_dot_segments(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || lower.contains('\\')
        || lower.contains("//")
    {
        return true;
    }
    path.split('/').any(|seg| seg == "." || seg == "..")
}

/// Property tests (a fixed budget in every test run): whatever path a client sends, one that
/// passes the guards stays under `/v1/` once percent-decoded and resolved, so the URL built
/// from it never leaves the target's API prefix.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn percent_decoded(p: &str) -> String {
        let b = p.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if b[i] == b'%'
                && let (Some(h), Some(l)) = (
                    b.get(i + 1).copied().and_then(hex),
                    b.get(i + 2).copied().and_then(hex),
                )
            {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(approxy_verifier::testing::property_cases(2048)))]
        #[test]
        fn an_allowed_path_never_leaves_the_api_prefix(
            segments in proptest::collection::vec(
                proptest::sample::select(vec!["v1", "models", "chat", "completions", "files", ".", "..", "%2e", "%2E%2e", "%2f", "%5C", "\\", "", "a", "x.y", ".hidden", "%252e"]),
                0..7,
            ),
            post in any::<bool>(),
        ) {
            let path = format!("/{}", segments.join("/"));
            let method = if post { Method::POST } else { Method::GET };
            if route_allowed(&method, &path, &[]) && !has_dot_segments(&path) {
                let decoded = percent_decoded(&path);
                prop_assert!(decoded.starts_with("/v1/"), "{path} -> {decoded}");
                prop_assert!(!decoded.contains("//") && !decoded.contains('\\'), "{path} -> {decoded}");
                prop_assert!(decoded.split('/').all(|s| s != "." && s != ".."), "{path} -> {decoded}");
            }
        }
    }
}
