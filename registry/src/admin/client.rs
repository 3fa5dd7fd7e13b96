//! The client side of `xcc.admin.v1.Admin`, for the CLI, the dashboard and tests: connecting
//! with an admin certificate, reading every page of a listing, and an error as the CLI prints
//! it.

use tonic::Status;
use xcc_proto::xcc::admin::v1 as api;

use super::PAGE_SIZE;

/// Every service `request` matches, page by page (whatever the catalog's size; each page stays
/// well under the message limit). The pages are read one after another, so a service changed
/// meanwhile is listed as it was when its page was read.
pub async fn list_all_services<T>(
    client: &mut api::admin_client::AdminClient<T>,
    mut request: api::ListServicesRequest,
) -> Result<Vec<api::Service>, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    if request.page_size == 0 {
        request.page_size = PAGE_SIZE;
    }
    let mut all = Vec::new();
    loop {
        let page = client.list_services(request.clone()).await?.into_inner();
        all.extend(page.services);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        request.page_token = page.next_page_token;
    }
}

/// An admin call's error as the CLI prints it: a TLS failure or a server without the admin API
/// (the Hamlet port, say) as one sentence with the fix ([`crate::dial_errors`]); anything else as
/// it came.
pub fn call_error(e: anyhow::Error, addr: &str) -> anyhow::Error {
    match e.downcast_ref::<tonic::Status>() {
        Some(status) => match crate::dial_errors::status_words(status, addr, "the admin API") {
            (text, Some(_)) => anyhow::anyhow!("admin API at {addr}: {text}"),
            (_, None) => e,
        },
        None => e,
    }
}

/// Connect an admin client to `addr` (`host:port`) with the caller's certificate (which must
/// carry an admin identity). `server_name` defaults to the host part of `addr`.
pub async fn connect(
    tls: xcc_certs::reload::ReloadingTls,
    addr: &str,
    server_name: Option<String>,
) -> anyhow::Result<api::admin_client::AdminClient<tonic::transport::Channel>> {
    use anyhow::Context as _;
    let host = addr
        .rsplit_once(':')
        .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').to_string())
        .unwrap_or_else(|| addr.to_string());
    let connector = xcc_certs::client::TlsConnector::new(tls, server_name.unwrap_or(host), None)?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .with_context(|| format!("invalid admin address {addr:?}"))?
        .connect_timeout(std::time::Duration::from_secs(10))
        .connect_with_connector(connector)
        .await
        .map_err(|e| {
            // A TLS failure is one sentence naming who refused whom; anything else keeps
            // tonic's chain.
            match xcc_certs::explain::explain_chain(&e, xcc_certs::explain::Side::Client, addr) {
                Some(text) => anyhow::anyhow!("admin API at {addr}: {text}"),
                None => {
                    anyhow::Error::new(e).context(format!("connecting to the admin API at {addr}"))
                }
            }
        })?;
    Ok(api::admin_client::AdminClient::new(channel))
}
