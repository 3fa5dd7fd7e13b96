//! Reconciling one key: a group's Service, EndpointSlices and Endpoints, or a Cilium global
//! Service; removing what no record calls for; the orphan check; the `Conflict` conditions.

use super::*;

impl Ctx {
    pub(super) async fn reconcile(&self, key: &Key) -> Result<(), ReconcileError> {
        match key {
            Key::Group(g) => self.reconcile_group(key, g).await,
            Key::Global(o) => self.reconcile_global(key, o).await,
        }
    }

    pub(super) async fn reconcile_group(
        &self,
        key: &Key,
        group: &GroupKey,
    ) -> Result<(), ReconcileError> {
        self.warn_without_origin(group).await;
        let sources = self.sources(key);
        if sources.is_empty() {
            self.forget_warning(key);
            return self.remove_group(group).await;
        }
        let all: Vec<&ServiceRecord> = sources.iter().map(AsRef::as_ref).collect();
        // Conditions and Events go on the imported records only: this cluster's own exports
        // are the publisher's, in other namespaces.
        let refs: Vec<&ServiceRecord> = all
            .iter()
            .copied()
            .filter(|r| r.metadata.namespace.as_deref() == Some(self.config.namespace.as_str()))
            .collect();
        let m = match materialize(group, &all) {
            Ok(m) => m,
            Err(Skip::Empty) => return self.remove_group(group).await,
            Err(e @ Skip::NoPorts(_)) => {
                // Nothing valid to write; what exists stays until a record changes.
                self.warn_once(key, &refs, "NoPorts", &e.to_string()).await;
                return Ok(());
            }
        };
        self.forget_warning(key);
        for d in &m.dropped {
            tracing::debug!(record = %d.record, endpoint = %d.endpoint, reason = d.reason, "endpoint left out");
        }
        let known = self.slices.state();
        let found = match apply::sync_group_known(
            &self.client,
            &group.namespace,
            &m,
            known.iter().map(AsRef::as_ref),
        )
        .await
        {
            Ok(written) => {
                self.count_written(&written, &group.namespace).await;
                self.observe_propagation(&refs);
                m.conflict.as_ref().map(|c| Found {
                    reason: conditions::PORTS_DISAGREE,
                    message: c.to_string(),
                })
            }
            Err(ApplyError::Api(e)) => return Err(e.into()),
            Err(e @ ApplyError::NotManaged { .. }) => {
                return Err(self.not_managed(&refs, e).await);
            }
        };
        self.set_conflicts(&refs, found.as_ref()).await
    }

    pub(super) async fn reconcile_global(
        &self,
        key: &Key,
        origin: &OriginKey,
    ) -> Result<(), ReconcileError> {
        let sources = self.sources(key);
        if sources.is_empty() {
            return self.orphan_check(key, origin).await;
        }
        let refs: Vec<&ServiceRecord> = sources.iter().map(AsRef::as_ref).collect();
        let install = self.config.namespace.as_str();
        let desired = match cilium::global_service(origin, &refs, install) {
            Ok(s) => s,
            Err(CiliumSkip::Empty) => return self.orphan_check(key, origin).await,
            Err(e @ CiliumSkip::NoPorts(_)) => {
                self.warn_once(key, &refs, "NoPorts", &e.to_string()).await;
                return Ok(());
            }
        };
        self.forget_warning(key);
        let found = match apply::sync_global_service(&self.client, &desired, install).await {
            Ok(written) => {
                self.count_written(&written, &origin.namespace).await;
                self.observe_propagation(&refs);
                None
            }
            Err(ApplyError::Api(e)) => return Err(e.into()),
            Err(e @ ApplyError::NotManaged { .. }) => {
                return Err(self.not_managed(&refs, e).await);
            }
        };
        self.set_conflicts(&refs, found.as_ref()).await
    }

    /// Records of this FQDN group that ask for a Cilium global Service but name no origin
    /// cannot be materialised at all: a Warning Event on them (once).
    pub(super) async fn warn_without_origin(&self, group: &GroupKey) {
        let stuck: Vec<Arc<ServiceRecord>> = self
            .records
            .state()
            .into_iter()
            .filter(|r| {
                r.spec.origin.is_none()
                    && keys::group_key(r).as_ref() == Some(group)
                    && self.mode(r) == Materialize::CiliumGlobalService
            })
            .collect();
        let marker = Key::Global(OriginKey {
            namespace: group.namespace.clone(),
            name: format!("<no origin: {}>", group.fqdn),
        });
        if stuck.is_empty() {
            self.forget_warning(&marker);
            return;
        }
        let refs: Vec<&ServiceRecord> = stuck.iter().map(AsRef::as_ref).collect();
        self.warn_once(
            &marker,
            &refs,
            "NoOrigin",
            "its RemoteRegistry materialises CiliumGlobalService, which needs spec.origin; none is set",
        )
        .await;
    }

    /// The group has no source left: delete the binder's objects of it (normally the garbage
    /// collector has already, through the owner references).
    pub(super) async fn remove_group(&self, group: &GroupKey) -> Result<(), ReconcileError> {
        let ns = group.namespace.as_str();
        let name = names::service_name(&group.fqdn);
        let want = Some(Key::Group(group.clone()));
        if let Some(svc) = self.services.get(&ObjectRef::new(&name).within(ns))
            && svc.key(self) == want
        {
            let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
            if apply::delete_exact(&api, "Service", ns, &name, &uid_of(svc.as_ref())).await? {
                self.metrics.wrote("Service", "delete");
                self.event(
                    object_ref(svc.as_ref()),
                    EventType::Normal,
                    "Removed",
                    "Delete",
                    format!("no imported ServiceRecord for {} is left", group.fqdn),
                )
                .await;
            }
        }
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
        for slice in self.slices.state() {
            if slice.metadata.namespace.as_deref() == Some(ns)
                && keys::slice_service_name(&slice.metadata) == Some(name.as_str())
                && apply::delete_exact(
                    &api,
                    "EndpointSlice",
                    ns,
                    &slice.name_any(),
                    &uid_of(slice.as_ref()),
                )
                .await?
            {
                self.metrics.wrote("EndpointSlice", "delete");
            }
        }
        if let Some(ep) = self.endpoints.get(&ObjectRef::new(&name).within(ns)) {
            let api: Api<Endpoints> = Api::namespaced(self.client.clone(), ns);
            if apply::delete_exact(&api, "Endpoints", ns, &name, &uid_of(ep.as_ref())).await? {
                self.metrics.wrote("Endpoints", "delete");
            }
        }
        Ok(())
    }

    /// The orphan rule ([`crate::desired::cilium::orphan_decision`]) for a global Service whose
    /// sources are gone. Its warnings (kept,
    /// check refused) are sent once, not again at every resync or retry.
    pub(super) async fn orphan_check(
        &self,
        key: &Key,
        origin: &OriginKey,
    ) -> Result<(), ReconcileError> {
        let install = self.config.namespace.as_str();
        let Some(svc) = self
            .services
            .get(&ObjectRef::new(&origin.name).within(&origin.namespace))
            .filter(|svc| keys::is_global_service(svc, install))
        else {
            self.forget_warning(key);
            return Ok(());
        };
        let local = match self.local_endpoints(origin).await {
            Ok(local) => local,
            Err(e) => return Err(self.orphan_check_failed(key, &svc, e).await),
        };
        match cilium::orphan_decision(&svc, install, false, local) {
            OrphanDecision::Delete => {
                let api: Api<Service> = Api::namespaced(self.client.clone(), &origin.namespace);
                if apply::delete_exact(
                    &api,
                    "Service",
                    &origin.namespace,
                    &origin.name,
                    &uid_of(svc.as_ref()),
                )
                .await?
                {
                    self.metrics.wrote("Service", "delete");
                    self.event(
                        object_ref(svc.as_ref()),
                        EventType::Normal,
                        "Removed",
                        "Delete",
                        "no imported ServiceRecord for this global service is left".to_string(),
                    )
                    .await;
                }
            }
            OrphanDecision::Keep => {
                let note = format!(
                    "no imported ServiceRecord for this global service is left, but it has {local} local endpoint(s); kept"
                );
                if self.note_warning(key, "OrphanKept", &note) {
                    self.event(
                        object_ref(svc.as_ref()),
                        EventType::Normal,
                        "OrphanKept",
                        "Keep",
                        note,
                    )
                    .await;
                }
            }
        }
        Ok(())
    }

    /// The local endpoints of an orphaned global Service could not be counted: it is kept, and
    /// the key retried with backoff. A refusal (403: e.g. the binder runs under
    /// `overlays/importer` now, after it made the Service under `overlays/cilium`) will not mend
    /// itself: a Warning Event on the Service and an error in the log, once.
    pub(super) async fn orphan_check_failed(
        &self,
        key: &Key,
        svc: &Service,
        e: SyncError,
    ) -> ReconcileError {
        if matches!(&e.source, kube::Error::Api(s) if s.code == 403) {
            let note = format!(
                "no imported ServiceRecord for this global service is left, but its local endpoints cannot be counted ({e}); kept. Grant the binder deploy/overlays/cilium's rights, or delete the Service"
            );
            if self.note_warning(key, "OrphanCheckForbidden", &note) {
                tracing::error!(%key, %note, "orphan check refused");
                self.event(
                    object_ref(svc),
                    EventType::Warning,
                    "OrphanCheckForbidden",
                    "Delete",
                    note,
                )
                .await;
            }
        }
        e.into()
    }

    /// Endpoints of the Service `origin` that the binder did not write (EndpointSlices of
    /// other controllers).
    pub(super) async fn local_endpoints(&self, origin: &OriginKey) -> Result<usize, SyncError> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &origin.namespace);
        let slices = api
            .list(&ListParams::default().labels(&format!(
                "{ENDPOINTSLICE_SERVICE_NAME_LABEL}={}",
                origin.name
            )))
            .await
            .map_err(|source| SyncError {
                action: "list",
                kind: "EndpointSlice",
                namespace: origin.namespace.clone(),
                name: origin.name.clone(),
                source,
            })?;
        Ok(slices
            .items
            .iter()
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ENDPOINTSLICE_MANAGED_BY_LABEL))
                    .is_none_or(|v| v != BINDER_MANAGER)
            })
            .map(|s| s.endpoints.len())
            .sum())
    }

    /// Write each record's `Conflict` condition where it changed; a Warning Event on each
    /// record whose condition becomes `True` or changes reason.
    /// An object in the way is not ours: report it on the records, then fail the reconcile.
    pub(super) async fn not_managed(
        &self,
        records: &[&ServiceRecord],
        e: ApplyError,
    ) -> ReconcileError {
        let found = Found {
            reason: conditions::NOT_MANAGED,
            message: e.to_string(),
        };
        match self.set_conflicts(records, Some(&found)).await {
            Ok(()) => ReconcileError::NotManaged(e),
            Err(reporting) => reporting,
        }
    }

    pub(super) async fn set_conflicts(
        &self,
        records: &[&ServiceRecord],
        found: Option<&Found>,
    ) -> Result<(), ReconcileError> {
        let api: Api<ServiceRecord> = Api::namespaced(self.client.clone(), &self.config.namespace);
        for record in records {
            let current = record
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let Some(next) = conditions::next(current, found, record.metadata.generation, now)
            else {
                continue;
            };
            let name = record.name_any();
            let before = current
                .iter()
                .find(|c| c.type_ == next.type_)
                .map(|c| (c.status.clone(), c.reason.clone()));
            let patch = json!({
                "apiVersion": ServiceRecord::api_version(&()),
                "kind": ServiceRecord::kind(&()),
                "metadata": {"name": name},
                "status": {"conditions": [next]},
            });
            api.patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|source| ReconcileError::Status {
                name: name.clone(),
                source,
            })?;
            self.metrics.wrote("ServiceRecord", "status");
            let subject = format!("ServiceRecord {}", uid_of(*record));
            if next.status != "True" {
                self.forget_warning(&subject);
            } else if before != Some((next.status.clone(), next.reason.clone()))
                && self.note_warning(&subject, &next.reason, &next.message)
            {
                self.event(
                    object_ref(*record),
                    EventType::Warning,
                    "Conflict",
                    "Materialize",
                    next.message.clone(),
                )
                .await;
            }
        }
        Ok(())
    }
}
