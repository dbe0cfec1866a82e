//! Network traffic control programs.
use std::{ffi::CString, io, os::fd::AsFd as _, path::Path};

use aya_obj::generated::{
    TC_H_CLSACT, TC_H_MIN_EGRESS, TC_H_MIN_INGRESS,
    bpf_attach_type::{self, BPF_TCX_EGRESS, BPF_TCX_INGRESS},
    bpf_link_type,
    bpf_prog_type::BPF_PROG_TYPE_SCHED_CLS,
};
use thiserror::Error;

use super::{FdLink, ProgramInfo};
use crate::{
    VerifierLogLevel,
    programs::{
        Link, LinkError, LinkOrder, NetworkInterface, ProgramData, ProgramError, ProgramType,
        define_link_wrapper, id_as_key, impl_try_from_fdlink, impl_try_into_fdlink,
        load_program_without_attach_type, query,
    },
    sys::{
        BpfLinkCreateArgs, LinkTarget, NetlinkError, NetlinkSocket, ProgQueryTarget, SyscallError,
        bpf_link_create, bpf_link_update, bpf_prog_get_fd_by_id, netlink_find_filter_with_name,
        netlink_qdisc_add_clsact, netlink_qdisc_attach, netlink_qdisc_detach,
    },
    util::{KernelVersion, tc_handler_make},
};

/// Traffic control attach type.
#[derive(Debug, Clone, Copy, Hash, Eq, PartialEq)]
pub enum TcAttachType {
    /// Attach to ingress.
    Ingress,
    /// Attach to egress.
    Egress,
}

/// A network traffic control classifier.
///
/// [`SchedClassifier`] programs can be used to inspect, filter or redirect
/// network packets in both ingress and egress. They are executed as part of the
/// linux network traffic control system. See
/// [https://man7.org/linux/man-pages/man8/tc-bpf.8.html](https://man7.org/linux/man-pages/man8/tc-bpf.8.html).
///
/// # Examples
///
/// # Minimum kernel version
///
/// The minimum kernel version required to use this feature is 4.1.
///
/// ```no_run
/// # #[derive(Debug, thiserror::Error)]
/// # enum Error {
/// #     #[error(transparent)]
/// #     IO(#[from] std::io::Error),
/// #     #[error(transparent)]
/// #     Map(#[from] aya::maps::MapError),
/// #     #[error(transparent)]
/// #     Program(#[from] aya::programs::ProgramError),
/// #     #[error(transparent)]
/// #     Tc(#[from] aya::programs::tc::TcError),
/// #     #[error(transparent)]
/// #     Ebpf(#[from] aya::EbpfError)
/// # }
/// # let mut bpf = aya::Ebpf::load(&[])?;
/// use aya::programs::{tc, SchedClassifier, TcAttachType};
///
/// // Prepare clsact for the netlink backend used on older kernels.
/// tc::qdisc_add_clsact(c"eth0")?;
///
/// let prog: &mut SchedClassifier = bpf.program_mut("redirect_ingress").unwrap().try_into()?;
/// prog.load()?;
/// prog.attach(c"eth0", TcAttachType::Ingress)?;
///
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
#[doc(alias = "BPF_PROG_TYPE_SCHED_CLS")]
pub struct SchedClassifier {
    pub(crate) data: ProgramData<SchedClassifierLink>,
}

/// Errors from TC programs
#[derive(Debug, Error)]
pub enum TcError {
    /// a netlink error occurred.
    #[error(transparent)]
    NetlinkError(#[from] NetlinkError),
    /// the provided string contains a nul byte.
    #[error(transparent)]
    NulError(#[from] std::ffi::NulError),
    /// an IO error occurred.
    #[error(transparent)]
    IoError(#[from] io::Error),
    /// the clsact qdisc is already attached.
    #[error("the clsact qdisc is already attached")]
    AlreadyAttached,
    /// operation not supported for programs loaded via tcx.
    #[error("operation not supported for programs loaded via tcx")]
    InvalidLinkOperation,
}

impl TcAttachType {
    const fn bpf_attach_type(self) -> bpf_attach_type {
        match self {
            Self::Ingress => BPF_TCX_INGRESS,
            Self::Egress => BPF_TCX_EGRESS,
        }
    }
}

/// Attachment backend and target for a [`SchedClassifier`].
#[derive(Debug)]
pub enum TcAttach {
    /// Automatic backend selection for an ingress or egress hook.
    Auto(TcAttachType),
    /// A netlink filter parent and options.
    Netlink {
        /// Parent identifying the qdisc or class at which to attach the filter.
        parent: TcHandle,
        /// Options for the filter attached at this parent.
        options: NlOptions,
    },
    /// A TCX ingress or egress hook and program ordering.
    Tcx {
        /// Ingress or egress hook at which to attach the program.
        attach_type: TcAttachType,
        /// Ordering relative to other programs attached at this hook.
        order: LinkOrder,
    },
}

impl From<TcAttachType> for TcAttach {
    fn from(attach_type: TcAttachType) -> Self {
        Self::Auto(attach_type)
    }
}

/// A TC handle in `major:minor` form.
///
/// Matches the `M:N` syntax accepted by `tc(8)`. It can identify a filter,
/// class, or qdisc.
#[derive(Debug, Clone, Copy, Default, Hash, Eq, PartialEq)]
#[doc(alias = "tcm_handle")]
pub struct TcHandle {
    /// Upper 16 bits when encoded as a u32.
    major: u16,
    /// Lower 16 bits when encoded as a u32.
    minor: u16,
}

impl TcHandle {
    /// Sentinel that asks the kernel to allocate a handle at attach time.
    ///
    /// Equal to [`Default::default`]. The allocated value is exposed by
    /// [`SchedClassifierLink::handle`] after the program is attached.
    pub const AUTO_ASSIGN: Self = Self { major: 0, minor: 0 };

    /// Const equivalent of `Self { major, minor }`.
    pub const fn new(major: u16, minor: u16) -> Self {
        Self { major, minor }
    }
}

impl From<TcHandle> for u32 {
    fn from(TcHandle { major, minor }: TcHandle) -> Self {
        (Self::from(major) << 16) | Self::from(minor)
    }
}

impl From<u32> for TcHandle {
    fn from(value: u32) -> Self {
        Self {
            major: (value >> 16) as u16,
            minor: value as u16,
        }
    }
}

impl From<TcAttachType> for TcHandle {
    /// Returns the clsact parent for ingress or egress.
    fn from(attach_type: TcAttachType) -> Self {
        let minor = match attach_type {
            TcAttachType::Ingress => TC_H_MIN_INGRESS,
            TcAttachType::Egress => TC_H_MIN_EGRESS,
        };
        tc_handler_make(TC_H_CLSACT, minor).into()
    }
}

/// Options for [`SchedClassifier`] attach via netlink.
#[derive(Debug, Default, Hash, Eq, PartialEq)]
pub struct NlOptions {
    /// Priority assigned to tc program with lower number = higher priority.
    /// If set to default (0), the system chooses the next highest priority or 49152 if no filters exist yet
    pub priority: u16,
    /// Handle used to uniquely identify a program at a given priority level.
    ///
    /// Defaults to [`TcHandle::AUTO_ASSIGN`], which lets the kernel pick one.
    pub handle: TcHandle,
    /// `classid` bound to this filter (also known as `flowid` in `tc(8)`).
    ///
    /// In direct-action mode the major 16 bits of the resulting class id come
    /// from this attribute and the minor 16 bits come from the program at run
    /// time via `__sk_buff::tc_classid`. This split requires Linux 4.6 (commit
    /// [`3a461da1d`]).
    ///
    /// When [`None`], no attribute is sent and the filter is not bound to a
    /// class.
    ///
    /// [`3a461da1d`]: https://github.com/torvalds/linux/commit/3a461da1d
    #[doc(alias = "TCA_BPF_CLASSID")]
    pub classid: Option<TcHandle>,
}

impl SchedClassifier {
    /// The type of the program according to the kernel.
    pub const PROGRAM_TYPE: ProgramType = ProgramType::SchedClassifier;

    /// Loads the program inside the kernel.
    pub fn load(&mut self) -> Result<(), ProgramError> {
        let Self { data } = self;
        load_program_without_attach_type(BPF_PROG_TYPE_SCHED_CLS, data)
    }

    /// Attaches the program to an interface specified by name or index.
    ///
    /// Pass a name such as `c"eth0"`, an interface index, or a [`NetworkInterface`].
    ///
    /// Names are resolved in the calling thread's network namespace at the time of
    /// this call. Indices are used without an interface lookup and must refer to an
    /// interface in the same namespace.
    ///
    /// Pass a [`TcAttachType`] or [`TcAttach::Auto`] to select the backend
    /// automatically. On kernels >= 6.6.0, this uses TCX and attaches as the last
    /// TCX program for the selected ingress or egress hook. On older kernels,
    /// this uses netlink at the corresponding clsact parent with default
    /// [`NlOptions`].
    ///
    /// Pass [`TcAttach::Netlink`] to explicitly select netlink, or [`TcAttach::Tcx`]
    /// to select TCX and control link ordering. Explicit TCX attachment requires
    /// kernel >= 6.6.0. TCX attachment failures are returned without falling back
    /// to netlink, including when TCX was selected automatically.
    ///
    /// Automatic selection may produce either link backend. Select
    /// [`TcAttach::Netlink`] if your application requires a specific parent,
    /// netlink options, or netlink-specific link operations such as
    /// [`SchedClassifierLink::parent`], [`SchedClassifierLink::priority`],
    /// [`SchedClassifierLink::handle`], or [`SchedClassifierLink::classid`].
    ///
    /// For netlink attachment, convert a [`TcAttachType`] to select the
    /// corresponding clsact parent, or specify a custom [`TcHandle`]. The parent
    /// must already exist and support filters. Before attaching at a clsact
    /// ingress or egress parent, add the clsact qdisc with [`qdisc_add_clsact`],
    /// including when netlink is selected automatically. TCX does not require it.
    ///
    /// ```no_run
    /// # let mut bpf = aya::Ebpf::load(&[])?;
    /// use aya::programs::{tc, SchedClassifier, TcAttach, TcAttachType};
    ///
    /// // Prepare clsact for netlink attachment.
    /// tc::qdisc_add_clsact(c"eth0")?;
    ///
    /// let prog: &mut SchedClassifier = bpf.program_mut("redirect_ingress").unwrap().try_into()?;
    /// prog.load()?;
    /// prog.attach(c"eth0", TcAttach::Netlink {
    ///     parent: TcAttachType::Ingress.into(),
    ///     options: tc::NlOptions::default(),
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// The returned value can be used to detach, see [`SchedClassifier::detach`].
    ///
    /// # Link Pinning (TCX mode, kernel >= 6.6)
    ///
    /// Links can be pinned to bpffs for atomic replacement across process restarts.
    ///
    /// ```no_run
    /// # use std::{io, path::Path};
    ///
    /// # use aya::{
    /// #     programs::{
    /// #         LinkOrder, SchedClassifier, TcAttach, TcAttachType,
    /// #         links::{FdLink, LinkError, PinnedLink},
    /// #     },
    /// #     sys::SyscallError,
    /// # };
    ///
    /// # let mut bpf = aya::Ebpf::load(&[])?;
    /// # let prog: &mut SchedClassifier = bpf.program_mut("prog").unwrap().try_into()?;
    /// # prog.load()?;
    /// let pin_path = "/sys/fs/bpf/my_link";
    ///
    /// let link_id = match PinnedLink::from_pin(pin_path) {
    ///     Ok(old) => {
    ///         let link = FdLink::from(old).try_into()?;
    ///         prog.attach_to_link(link)?
    ///     }
    ///     Err(LinkError::SyscallError(SyscallError { io_error, .. }))
    ///         if io_error.kind() == io::ErrorKind::NotFound =>
    ///     {
    ///         prog.attach(
    ///             c"eth0",
    ///             TcAttach::Tcx {
    ///                 attach_type: TcAttachType::Ingress,
    ///                 order: LinkOrder::default(),
    ///             },
    ///         )?
    ///     }
    ///     Err(e) => return Err(e.into()),
    /// };
    ///
    /// let link = prog.take_link(link_id)?;
    /// let fd_link: FdLink = link.try_into()?;
    /// fd_link.pin(pin_path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// If no interface with the given name exists,
    /// [`ProgramError::UnknownInterface`] is returned.
    ///
    /// Other interface lookup failures return [`ProgramError::IOError`].
    ///
    /// Attachment failures return [`ProgramError::SyscallError`] for TCX or
    /// [`TcError::NetlinkError`] for netlink. A common cause of netlink failure is
    /// not having added the `clsact` qdisc to the interface, see [`qdisc_add_clsact`].
    pub fn attach<'a>(
        &mut self,
        interface: impl Into<NetworkInterface<'a>>,
        attach: impl Into<TcAttach>,
    ) -> Result<SchedClassifierLinkId, ProgramError> {
        let if_index = interface.into().if_index_for_program()?;
        match attach.into() {
            TcAttach::Auto(attach_type) => {
                if KernelVersion::at_least(6, 6, 0) {
                    self.attach_tcx(if_index, attach_type, LinkOrder::default())
                } else {
                    self.attach_netlink(if_index, attach_type.into(), NlOptions::default(), true)
                }
            }
            TcAttach::Netlink { parent, options } => {
                self.attach_netlink(if_index, parent, options, true)
            }
            TcAttach::Tcx { attach_type, order } => self.attach_tcx(if_index, attach_type, order),
        }
    }

    /// Atomically replaces the program referenced by the provided link.
    ///
    /// Ownership of the link will transfer to this program.
    pub fn attach_to_link(
        &mut self,
        link: SchedClassifierLink,
    ) -> Result<SchedClassifierLinkId, ProgramError> {
        let prog_fd = self.fd()?;
        let prog_fd = prog_fd.as_fd();
        match link.into_inner() {
            TcLinkInner::Fd(link) => {
                let fd = link.fd;
                let link_fd = fd.as_fd();

                bpf_link_update(link_fd.as_fd(), prog_fd, None, 0).map_err(|io_error| {
                    SyscallError {
                        call: "bpf_link_update",
                        io_error,
                    }
                })?;

                self.data
                    .links
                    .insert(SchedClassifierLink::new(TcLinkInner::Fd(FdLink::new(fd))))
            }
            TcLinkInner::NlLink(NlLink {
                if_index,
                parent,
                priority,
                handle,
                classid,
            }) => self.attach_netlink(
                if_index,
                parent,
                NlOptions {
                    priority,
                    handle,
                    classid,
                },
                false,
            ),
        }
    }

    fn attach_netlink(
        &mut self,
        if_index: u32,
        parent: TcHandle,
        options: NlOptions,
        create: bool,
    ) -> Result<SchedClassifierLinkId, ProgramError> {
        let prog_fd = self.fd()?;
        let prog_fd = prog_fd.as_fd();

        let name = self.data.name.as_deref().unwrap_or_default();
        // TODO: avoid this unwrap by adding a new error variant.
        let name = CString::new(name).unwrap();
        let (priority, handle) = netlink_qdisc_attach(
            if_index as i32,
            parent,
            prog_fd,
            &name,
            options.priority,
            options.handle,
            options.classid,
            create,
        )
        .map_err(TcError::NetlinkError)?;

        self.data
            .links
            .insert(SchedClassifierLink::new(TcLinkInner::NlLink(NlLink {
                if_index,
                parent,
                priority,
                handle,
                classid: options.classid,
            })))
    }

    fn attach_tcx(
        &mut self,
        if_index: u32,
        attach_type: TcAttachType,
        order: LinkOrder,
    ) -> Result<SchedClassifierLinkId, ProgramError> {
        let prog_fd = self.fd()?;
        let link_fd = bpf_link_create(
            prog_fd.as_fd(),
            LinkTarget::IfIndex(if_index),
            attach_type.bpf_attach_type(),
            order.flags.bits(),
            Some(BpfLinkCreateArgs::Tcx(&order.link_ref)),
        )
        .map_err(|io_error| SyscallError {
            call: "bpf_mprog_attach",
            io_error,
        })?;

        self.data
            .links
            .insert(SchedClassifierLink::new(TcLinkInner::Fd(FdLink::new(
                link_fd,
            ))))
    }

    /// Creates a program from a pinned entry on a bpffs.
    ///
    /// Existing links will not be populated. To work with existing links you should use [`crate::programs::links::PinnedLink`].
    ///
    /// On drop, any managed links are detached and the program is unloaded. This will not result in
    /// the program being unloaded from the kernel if it is still pinned.
    pub fn from_pin<P: AsRef<Path>>(path: P) -> Result<Self, ProgramError> {
        let data = ProgramData::from_pinned_path(path, VerifierLogLevel::default())?;
        Ok(Self { data })
    }

    /// Queries a given interface for attached TCX programs.
    ///
    /// Pass a name such as `c"eth0"`, an interface index, or a [`NetworkInterface`].
    ///
    /// Names are resolved in the calling thread's network namespace at the time of
    /// this call. Indices are used without an interface lookup and must refer to an
    /// interface in the same namespace.
    /// Queries support ingress and egress TCX attach points.
    ///
    /// # Errors
    ///
    /// If no interface with the given name exists,
    /// [`ProgramError::UnknownInterface`] is returned.
    ///
    /// Other interface lookup failures return [`ProgramError::IOError`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use aya::programs::tc::{TcAttachType, SchedClassifier};
    /// # #[derive(Debug, thiserror::Error)]
    /// # enum Error {
    /// #     #[error(transparent)]
    /// #     Program(#[from] aya::programs::ProgramError),
    /// # }
    /// let (revision, programs) = SchedClassifier::query_tcx(c"eth0", TcAttachType::Ingress)?;
    /// # Ok::<(), Error>(())
    /// ```
    pub fn query_tcx<'a>(
        interface: impl Into<NetworkInterface<'a>>,
        attach_type: TcAttachType,
    ) -> Result<(u64, Vec<ProgramInfo>), ProgramError> {
        let if_index = interface.into().if_index_for_program()?;

        let (revision, prog_ids) = query(
            ProgQueryTarget::IfIndex(if_index),
            attach_type.bpf_attach_type(),
            0,
            &mut None,
        )?;

        let prog_infos = prog_ids
            .into_iter()
            .map(|prog_id| {
                let prog_fd = bpf_prog_get_fd_by_id(prog_id)?;
                let prog_info = ProgramInfo::new_from_fd(prog_fd.as_fd())?;
                Ok::<ProgramInfo, ProgramError>(prog_info)
            })
            .collect::<Result<_, _>>()?;

        Ok((revision, prog_infos))
    }
}

#[derive(Debug, Hash, Eq, PartialEq)]
pub(crate) struct NlLinkId(u32, TcHandle, u16, TcHandle);

#[derive(Debug)]
pub(crate) struct NlLink {
    if_index: u32,
    parent: TcHandle,
    priority: u16,
    handle: TcHandle,
    classid: Option<TcHandle>,
}

impl Link for NlLink {
    type Id = NlLinkId;
    type Error = ProgramError;

    fn id(&self) -> Self::Id {
        NlLinkId(self.if_index, self.parent, self.priority, self.handle)
    }

    fn detach(self) -> Result<(), Self::Error> {
        let Self {
            if_index,
            parent,
            priority,
            handle,
            classid: _classid,
        } = self;
        netlink_qdisc_detach(if_index as i32, parent, priority, handle)
            .map_err(ProgramError::NetlinkError)?;
        Ok(())
    }
}

id_as_key!(NlLink, NlLinkId);

#[derive(Debug, Hash, Eq, PartialEq)]
pub(crate) enum TcLinkIdInner {
    FdLinkId(<FdLink as Link>::Id),
    NlLinkId(<NlLink as Link>::Id),
}

#[derive(Debug)]
pub(crate) enum TcLinkInner {
    Fd(FdLink),
    NlLink(NlLink),
}

impl Link for TcLinkInner {
    type Id = TcLinkIdInner;
    type Error = ProgramError;

    fn id(&self) -> Self::Id {
        match self {
            Self::Fd(link) => TcLinkIdInner::FdLinkId(link.id()),
            Self::NlLink(link) => TcLinkIdInner::NlLinkId(link.id()),
        }
    }

    fn detach(self) -> Result<(), Self::Error> {
        match self {
            Self::Fd(link) => link.detach().map_err(Into::into),
            Self::NlLink(link) => link.detach(),
        }
    }
}

id_as_key!(TcLinkInner, TcLinkIdInner);

impl<'a> TryFrom<&'a SchedClassifierLink> for &'a FdLink {
    type Error = LinkError;

    fn try_from(value: &'a SchedClassifierLink) -> Result<Self, Self::Error> {
        if let TcLinkInner::Fd(fd) = value.inner() {
            Ok(fd)
        } else {
            Err(LinkError::InvalidLink)
        }
    }
}

impl_try_into_fdlink!(SchedClassifierLink, TcLinkInner);
impl_try_from_fdlink!(
    SchedClassifierLink,
    TcLinkInner,
    bpf_link_type::BPF_LINK_TYPE_TCX
);

define_link_wrapper!(
    SchedClassifierLink,
    SchedClassifierLinkId,
    TcLinkInner,
    TcLinkIdInner,
    SchedClassifier,
);

impl SchedClassifierLink {
    /// Constructs a [`SchedClassifierLink`] where the `interface`, `parent`,
    /// `priority` and `handle` are already known. This may have been found from a link created by
    /// [`SchedClassifier::attach`], the output of the `tc filter` command or from the output of
    /// another BPF loader.
    ///
    /// Note: If you create a link for a program that you do not own, detaching it may have
    /// unintended consequences.
    ///
    /// Pass a name such as `c"eth0"`, an interface index, or a [`NetworkInterface`].
    ///
    /// Names are resolved in the calling thread's network namespace at the time of
    /// this call. Indices are used without an interface lookup and must refer to an
    /// interface in the same namespace.
    ///
    /// # Errors
    /// Returns [`io::Error`] if the interface name cannot be resolved. Interface indices
    /// and the other parameters are not validated by this call; invalid values will cause a later
    /// [`SchedClassifierLink::detach`] to return [`TcError::NetlinkError`].
    ///
    /// # Examples
    /// ```no_run
    /// # use aya::programs::tc::{SchedClassifierLink, TcHandle};
    /// # use aya::programs::TcAttachType;
    /// # #[derive(Debug, thiserror::Error)]
    /// # enum Error {
    /// #     #[error(transparent)]
    /// #     IO(#[from] std::io::Error),
    /// # }
    /// # fn read_persisted_link_details() -> (&'static std::ffi::CStr, TcHandle, u16, TcHandle, Option<TcHandle>) {
    /// #     (c"eth0", TcAttachType::Ingress.into(), 50, TcHandle::new(0, 1), None)
    /// # }
    /// // Get the link parameters from some external source. Where and how the parameters are
    /// // persisted is up to your application.
    /// let (if_name, parent, priority, handle, classid) = read_persisted_link_details();
    /// let new_tc_link =
    ///     SchedClassifierLink::attached(if_name, parent, priority, handle, classid)?;
    ///
    /// # Ok::<(), Error>(())
    /// ```
    pub fn attached<'a>(
        interface: impl Into<NetworkInterface<'a>>,
        parent: TcHandle,
        priority: u16,
        handle: TcHandle,
        classid: Option<TcHandle>,
    ) -> Result<Self, io::Error> {
        let if_index = interface.into().if_index()?;
        Ok(Self(Some(TcLinkInner::NlLink(NlLink {
            if_index,
            parent,
            priority,
            handle,
            classid,
        }))))
    }

    /// Returns the parent at which the netlink filter is attached.
    ///
    /// # Errors
    ///
    /// Returns [`TcError::InvalidLinkOperation`] if this is a TCX link.
    pub fn parent(&self) -> Result<TcHandle, ProgramError> {
        if let TcLinkInner::NlLink(n) = self.inner() {
            Ok(n.parent)
        } else {
            Err(TcError::InvalidLinkOperation.into())
        }
    }

    /// Returns the allocated priority. If none was provided at attach time, this was allocated for you.
    ///
    /// # Errors
    ///
    /// Returns [`TcError::InvalidLinkOperation`] if this is a TCX link.
    pub fn priority(&self) -> Result<u16, ProgramError> {
        if let TcLinkInner::NlLink(n) = self.inner() {
            Ok(n.priority)
        } else {
            Err(TcError::InvalidLinkOperation.into())
        }
    }

    /// Returns the assigned handle. If none was provided at attach time, this was allocated for you.
    ///
    /// # Errors
    ///
    /// Returns [`TcError::InvalidLinkOperation`] if this is a TCX link.
    pub fn handle(&self) -> Result<TcHandle, ProgramError> {
        if let TcLinkInner::NlLink(n) = self.inner() {
            Ok(n.handle)
        } else {
            Err(TcError::InvalidLinkOperation.into())
        }
    }

    /// Returns the `classid` bound to this filter, or [`None`] if the filter
    /// is not bound to a class. See [`NlOptions::classid`].
    ///
    /// # Errors
    ///
    /// Returns [`TcError::InvalidLinkOperation`] if this is a TCX link.
    pub fn classid(&self) -> Result<Option<TcHandle>, ProgramError> {
        if let TcLinkInner::NlLink(n) = self.inner() {
            Ok(n.classid)
        } else {
            Err(TcError::InvalidLinkOperation.into())
        }
    }
}

/// Add the `clsact` qdisc to the given interface.
///
/// The `clsact` qdisc must be added before attaching a [`SchedClassifier`]
/// through netlink at its ingress or egress parent. TCX does not require it.
///
/// Pass a name such as `c"eth0"`, an interface index, or a [`NetworkInterface`].
///
/// Names are resolved in the calling thread's network namespace at the time of
/// this call. Indices are used without an interface lookup and must refer to an
/// interface in the same namespace.
pub fn qdisc_add_clsact<'a>(interface: impl Into<NetworkInterface<'a>>) -> Result<(), TcError> {
    let if_index = interface.into().if_index()?;
    netlink_qdisc_add_clsact(if_index as i32).map_err(TcError::NetlinkError)
}

/// Detaches the programs with the given name.
///
/// Pass an interface name such as `c"eth0"`, an interface index, or a [`NetworkInterface`].
///
/// Names are resolved in the calling thread's network namespace at the time of
/// this call. Indices are used without an interface lookup and must refer to an
/// interface in the same namespace.
/// Convert a [`TcAttachType`] to select its clsact parent, or specify the custom
/// parent used for netlink attachment.
///
/// # Errors
///
/// Returns [`io::ErrorKind::NotFound`] to indicate that no programs with the
/// given name were found, so nothing was detached. Other error kinds indicate
/// an actual failure while detaching a program.
pub fn qdisc_detach_program<'a>(
    interface: impl Into<NetworkInterface<'a>>,
    parent: TcHandle,
    name: &str,
) -> Result<(), TcError> {
    let cstr = CString::new(name).map_err(TcError::NulError)?;
    let if_index = interface.into().if_index()? as i32;

    let sock = NetlinkSocket::open().map_err(NetlinkError::from)?;
    let filter_info = netlink_find_filter_with_name(&sock, if_index, parent, &cstr)?;
    // Check for errors before detaching any programs.
    let filter_info: Vec<_> = filter_info.collect::<Result<_, _>>()?;
    if filter_info.is_empty() {
        return Err(TcError::IoError(io::Error::new(
            io::ErrorKind::NotFound,
            name.to_owned(),
        )));
    }

    for (prio, handle) in filter_info {
        netlink_qdisc_detach(if_index, parent, prio, handle)?;
    }

    Ok(())
}
