// SPDX-License-Identifier: GPL-2.0-only

//! pcifab: host-side driver for the management endpoint (MEP) of a multi-host PCIe switch
//! fabric (Microchip Switchtec PAX class).
//!
//! The MEP is function 1 beside the switch's upstream port. Its BAR0 holds the Switchtec Gen4
//! global address space ([`regs`]). Each bound MEP gets a character device `/dev/pcifabN`
//! ([`chardev`]) whose sysfs directory (`/sys/class/misc/pcifabN/`) carries the attributes of
//! [`sysfs`].

use kernel::{
    device::Core,
    dma::DmaMask,
    io::{register::Array, Io},
    irq,
    pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{ordering::Relaxed, Atomic},
        new_mutex, Arc, Mutex,
    },
    workqueue::{new_delayed_work, new_work, DelayedWork, Work}, //
};

mod chardev;
mod compose;
mod dmaep;
mod dmaep_regs;
mod event;
mod fabric;
mod fnsysfs;
mod fw;
mod headers;
mod hotplug;
mod kext;
mod mrpc;
mod p2p;
mod payload;
mod regs;
mod sysfs;
mod telemetry;
mod turn;
mod uapi;

/// The BAR0 mapping, sized so that every fixed register offset is checked at compile time.
type Bar0<'bound> = pci::Bar<'bound, { regs::GAS_SIZE }>;

/// What the system-information block says about the switch.
#[derive(Clone, Copy, Default)]
pub(crate) struct Identity {
    pub(crate) device_id: u32,
    pub(crate) device_version: u32,
    pub(crate) fw_version: u32,
    pub(crate) partition: u32,
    pub(crate) partition_count: u32,
    pub(crate) vendor_id: [u8; regs::SYS_VENDOR_ID_LEN],
    pub(crate) product_id: [u8; regs::SYS_PRODUCT_ID_LEN],
    pub(crate) product_revision: [u8; regs::SYS_PRODUCT_REV_LEN],
}

/// State of one management endpoint shared by the driver, open files and sysfs.
///
/// Open files hold an [`Arc`] to it and may outlive the binding; the BAR is a [`pci::DevresBar`],
/// so once the device is unbound every access fails with `ENODEV` instead of touching hardware
/// that is gone.
#[pin_data]
pub(crate) struct Mep {
    /// The endpoint's PCI device, for finding functions behind our switch's ports.
    pdev: ARef<pci::Device>,
    bar: pci::DevresBar<{ regs::GAS_SIZE }>,
    pci_vendor: u16,
    pci_device: u16,
    /// This host's partition, checked against [`regs::MAX_PARTITIONS`] at probe.
    partition: usize,
    /// The PFF instances of the partition's ports, read at probe ([`headers::Pffs`]).
    pffs: headers::Pffs,
    /// The firmware's extensions ([`fw::ext::Features`]), found at probe.
    features: Atomic<u32>,
    /// The switch's index in the fabric (`GET_PAX_ID`), found at probe.
    pax_id: Atomic<u32>,
    #[pin]
    pub(crate) mrpc: mrpc::Mrpc,
    #[pin]
    pub(crate) events: event::Events,
    #[pin]
    pub(crate) fabric: fabric::Fabric,
    #[pin]
    pub(crate) compose: compose::Compose,
    #[pin]
    pub(crate) p2p: p2p::P2p,
    /// The firmware's lies caught so far ([`fw::Lies`]).
    #[pin]
    pub(crate) lies: fw::Lies,
    /// Unbind requests that came after their function left ([`fw::stale`]), counted and
    /// rate-limited as lies are.
    #[pin]
    pub(crate) stale_requests: fw::Lies,
    /// Telemetry answers, cached so that sysfs readers cannot monopolise the mailbox.
    #[pin]
    pub(crate) telemetry: telemetry::Cache,
    /// Reads fabric-manager events in process context ([`event`]).
    #[pin]
    gfms_work: Work<Mep>,
    /// The per-function sysfs directories while the character device is registered
    /// ([`fnsysfs`]); taken out (breaking their references back to this) at unregistration.
    #[pin]
    fn_dirs: Mutex<Option<fnsysfs::FnDirs>>,
    /// Brings [`Mep::fn_dirs`] up to date with the fabric after a fabric event ([`fnsysfs`]).
    #[pin]
    fn_dirs_work: Work<Mep, 1>,
    /// Sets the events up again after a reset of the device took them ([`event`]).
    #[pin]
    events_check: DelayedWork<Mep, 2>,
}

impl Mep {
    /// Runs `f` on the mapped BAR0.
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device has been unbound.
    pub(crate) fn with_bar<R>(&self, f: impl for<'a> FnOnce(&Bar0<'a>) -> R) -> Result<R> {
        self.bar.try_access_with(f).ok_or(ENODEV)
    }

    /// Whether the endpoint is still bound (its BAR still mapped).
    /// The PFF instances of this partition's ports, upstream first.
    pub(crate) fn pffs(&self) -> &headers::Pffs {
        &self.pffs
    }

    pub(crate) fn present(&self) -> bool {
        self.with_bar(|_| ()).is_ok()
    }

    /// Reads the identity of the switch from the system-information block.
    pub(crate) fn identity(&self) -> Result<Identity> {
        self.with_bar(|bar| {
            let mut id = Identity {
                device_id: bar.read(regs::SYS_DEVICE_ID).value().into(),
                device_version: bar.read(regs::SYS_DEVICE_VERSION).value().into(),
                fw_version: bar.read(regs::SYS_FW_VERSION).value().into(),
                partition: u32::from(u8::from(bar.read(regs::SYS_PARTITION_ID).partition())),
                partition_count: u32::from(u8::from(bar.read(regs::NTB_PARTITION_COUNT).count()))
                    .max(1),
                ..Identity::default()
            };
            read_bytes(bar, regs::SYS_VENDOR_ID, &mut id.vendor_id)?;
            read_bytes(bar, regs::SYS_PRODUCT_ID, &mut id.product_id)?;
            read_bytes(bar, regs::SYS_PRODUCT_REV, &mut id.product_revision)?;
            Ok(id)
        })?
    }

    /// Whether the firmware runs: its device id still equals the endpoint's PCI device id.
    pub(crate) fn firmware_running(&self) -> Result<bool> {
        let id: u32 = self.with_bar(|bar| bar.read(regs::SYS_DEVICE_ID).value().into())?;
        Ok(id == u32::from(self.pci_device))
    }

    /// PCI vendor and device id of the management endpoint.
    pub(crate) fn features(&self) -> fw::ext::Features {
        fw::ext::Features::from_bits(self.features.load(Relaxed))
    }

    pub(crate) fn pax_id(&self) -> u8 {
        u8::try_from(self.pax_id.load(Relaxed)).unwrap_or(0)
    }

    pub(crate) fn pci_ids(&self) -> (u16, u16) {
        (self.pci_vendor, self.pci_device)
    }
}

/// Copies `out.len()` bytes of the system-information block starting at `gas_offset`.
fn read_bytes(bar: &Bar0<'_>, gas_offset: usize, out: &mut [u8]) -> Result {
    for (i, byte) in out.iter_mut().enumerate() {
        let loc =
            regs::SYS_INFO_BYTE::try_at(regs::sys_info_index(gas_offset) + i).ok_or(EINVAL)?;
        *byte = bar.read(loc).value().into();
    }
    Ok(())
}

/// Per-binding driver data. Fields drop in declaration order: the character device goes
/// first (no new users), then the interrupt handler, then the vectors it runs on.
#[pin_data]
struct PcifabData<'bound> {
    /// Dropped first (with the per-function directories below it): no new users.
    chardev: chardev::Registration,
    #[pin]
    irq: irq::Registration<'bound, event::Handler>,
    /// DMA MRPC's own vector, when the firmware offers DMA MRPC.
    dma_irq: Option<Pin<KBox<irq::Registration<'bound, mrpc::DmaHandler>>>>,
    vectors: pci::IrqVectorRegistration<'bound>,
    /// Puts back the downstream ports' ACS control that probe changed (also when probe
    /// fails after changing it).
    acs: hotplug::AcsRestore,
    /// Quiets the device and waits for fabric-event work an interrupt queued before it was
    /// freed.
    mep: MepGuard,
    /// Dropped last: the device's enable, once nothing uses the device any more.
    enabled: kext::pci_enable::EnabledDevice,
}

/// Holds the endpoint for the binding. On drop (at unbind, or when probe fails after the
/// endpoint was set up) it leaves the device quiet before anything the device could still
/// write to or raise goes away: the DMA engine reset and idle before its ring is freed, the
/// event interrupts off, waiters woken with `ENODEV`, and no fabric-event work running
/// unless it is in a hot-plug removal ([`stop_work`]). Every step is idempotent: at unbind
/// [`PcifabDriver::quiesce`] already did them.
struct MepGuard(Arc<Mep>);

impl core::ops::Deref for MepGuard {
    type Target = Arc<Mep>;
    fn deref(&self) -> &Arc<Mep> {
        &self.0
    }
}

impl Drop for MepGuard {
    fn drop(&mut self) {
        self.0.mrpc.kill();
        self.0.mrpc.dma_shut_down(&self.0);
        let in_hotplug = self.0.compose.shut_down();
        p2p::shut_down(&self.0);
        let _ = event::enable(&self.0, false);
        self.0.events.shut_down();
        stop_work(&self.0, in_hotplug);
    }
}

/// Waits for the fabric-event and directory work of `mep` to end, unless a hot-plug removal
/// is in progress (`in_hotplug`, from [`compose::Compose::shut_down`]).
///
/// The endpoint's removal may run under the PCI rescan/remove lock (its sysfs `remove`,
/// pciehp removing the switch's uplink, AER or DPC recovery). A hot-plug removal waits for
/// pciehp's interrupt thread, which takes that lock: waiting for the work then would never
/// end. The work is left to finish on its own instead: it holds a reference to the endpoint,
/// every step after the removal checks that the endpoint is going away or fails with
/// `ENODEV`, and it runs on the module's workqueue, which the module's exit drains
/// (`Documentation/design.rst`, "Hot-plug and the rescan lock").
fn stop_work(mep: &Mep, in_hotplug: bool) {
    // Takes no lock a removal may hold: waited for in a hot-plug removal too.
    event::stop_check(mep);
    if in_hotplug {
        dev_info!(
            mep.pdev,
            "a hot-plug removal is in progress: not waiting for it\n"
        );
    } else {
        event::flush_work(mep);
    }
    fnsysfs::flush(mep);
}

struct PcifabDriver;

/// Gen4 (PFX/PSX/PAX) device ids: the in-tree switchtec driver's 0x40xx..0x45xx range.
const GEN4_DEVICE_IDS: core::ops::RangeInclusive<u16> = 0x4000..=0x45ff;

// Management endpoints are matched by vendor and exact class (0x058000), as the in-tree
// switchtec driver does; the generation is checked in probe.
kernel::pci_device_table!(
    PCI_TABLE,
    <PcifabDriver as pci::Driver>::IdInfo,
    [(
        pci::DeviceId::from_class_and_vendor(
            pci::Class::MEMORY_OTHER,
            pci::ClassMask::Full,
            pci::Vendor::MICROSEMI,
        ),
        ()
    )]
);

impl pci::Driver for PcifabDriver {
    type IdInfo = ();
    type Data<'bound> = PcifabData<'bound>;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn unbind<'bound>(_pdev: &'bound pci::Device<Core<'_>>, this: Pin<&Self::Data<'bound>>) {
        Self::quiesce(&this);
    }

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        pin_init::pin_init_scope(move || {
            if !GEN4_DEVICE_IDS.contains(&pdev.device_id()) {
                dev_info!(
                    pdev,
                    "device {:#06x} is not a Gen4 switch\n",
                    pdev.device_id()
                );
                return Err(ENODEV);
            }
            // Disabled again when probe fails below or the driver unbinds (dropped last).
            let enabled = kext::pci_enable::EnabledDevice::new(pdev)?;
            probe_step(pdev, 1)?;

            let bar = pdev
                .iomap_region_sized::<{ regs::GAS_SIZE }>(0, c"pcifab")
                .inspect_err(|_| {
                    dev_err!(
                        pdev,
                        "BAR0 is not a {} byte register space\n",
                        regs::GAS_SIZE
                    )
                })?
                .into_devres()?;
            probe_step(pdev, 2)?;
            let (pci_vendor, pci_device) = (pdev.vendor_id().as_raw(), pdev.device_id());
            let partition = bar
                .try_access_with(|bar| u8::from(bar.read(regs::SYS_PARTITION_ID).partition()))
                .ok_or(ENODEV)?;
            let partition = usize::from(partition);
            if partition >= regs::MAX_PARTITIONS {
                dev_err!(pdev, "partition {} out of range\n", partition);
                return Err(ENODEV);
            }
            let pffs = bar
                .try_access_with(|bar| headers::local_pffs(bar, partition))
                .ok_or(ENODEV)??;
            // Guarded from here on: a failure at any later step leaves the device quiet (DMA
            // MRPC and the DMA engine disarmed) before the buffers they point at are freed.
            let mep = MepGuard(Arc::pin_init(
                try_pin_init!(Mep {
                    pdev: pdev.into(),
                    bar,
                    pci_vendor,
                    pci_device,
                    partition,
                    pffs,
                    features: Atomic::new(0),
                    pax_id: Atomic::new(0),
                    mrpc <- mrpc::Mrpc::new(),
                    events <- event::Events::new(),
                    fabric <- fabric::Fabric::new(),
                    compose <- compose::Compose::new(),
                    p2p <- p2p::P2p::new(),
                    telemetry <- telemetry::Cache::new(),
                    lies <- fw::Lies::new(),
                    stale_requests <- fw::Lies::new(),
                    gfms_work <- new_work!("pcifab::gfms_work"),
                    fn_dirs <- new_mutex!(None, "pcifab::fn_dirs"),
                    fn_dirs_work <- new_work!("pcifab::fn_dirs_work"),
                    events_check <- new_delayed_work!("pcifab::events_check"),
                }),
                GFP_KERNEL,
            )?);
            // Before any command: a previous kernel (kexec) or a failed probe may have left
            // DMA MRPC pointing at memory that is no longer its.
            mep.mrpc.disarm_stale(&mep)?;
            probe_step(pdev, 3)?;

            let id = mep.identity()?;
            if id.device_id != u32::from(pdev.device_id()) {
                dev_err!(
                    pdev,
                    "firmware not running: device id {:#x}, expected {:#x}\n",
                    id.device_id,
                    pdev.device_id()
                );
                return Err(ENODEV);
            }
            if id.partition >= id.partition_count || id.partition as usize >= regs::MAX_PARTITIONS {
                dev_err!(
                    pdev,
                    "partition {} out of range (count {})\n",
                    id.partition,
                    id.partition_count
                );
                return Err(ENODEV);
            }
            dev_info!(
                pdev,
                "switch {:#06x} firmware {:08x}, partition {} of {}\n",
                id.device_id,
                id.fw_version,
                id.partition,
                id.partition_count
            );

            probe_step(pdev, 4)?;
            let vectors = pdev.alloc_irq_vectors(1, 4, pci::IrqTypes::all())?;
            probe_step(pdev, 5)?;
            let vector = event::vector(&mep)?;
            if vector >= vectors.len() {
                dev_err!(
                    pdev,
                    "event vector {} beyond the {} allocated\n",
                    vector,
                    vectors.len()
                );
                return Err(ENODEV);
            }
            kext::dma::set_masks(pdev, DmaMask::new::<64>(), u32::MAX)?;
            probe_step(pdev, 6)?;
            mep.pax_id.store(
                fw::query(&mep, &fw::sys::GetPaxId::new())?.id.into(),
                Relaxed,
            );
            probe_step(pdev, 7)?;
            let features = fw::ext::Features::discover(&mep)?;
            mep.features.store(features.bits(), Relaxed);
            // Likewise the DMA engine, once the firmware said it has one.
            p2p::disarm_stale(&mep);
            // Bus mastering only now: DMA MRPC or a DMA engine a previous kernel left armed
            // cannot write to memory before both are off. Nothing before needs it (commands
            // are polled until the interrupt handlers are registered).
            pdev.set_master();
            probe_step(pdev, 8)?;
            dev_info!(
                pdev,
                "PAX id {}, firmware extensions {:#x}\n",
                mep.pax_id(),
                features.bits()
            );
            let dma_vector = mep.mrpc.dma_init(&mep, pdev.as_ref(), vectors.len())?;
            dev_info!(
                pdev,
                "MRPC through {}\n",
                if dma_vector.is_some() {
                    "DMA"
                } else {
                    "the mailbox"
                }
            );
            probe_step(pdev, 9)?;
            p2p::init(&mep, pdev.as_ref(), vector)?;
            probe_step(pdev, 10)?;
            let acs = if module_parameters::p2p_acs_relax.value() {
                hotplug::AcsRestore::apply(pdev)
            } else {
                hotplug::AcsRestore::none()
            };
            probe_step(pdev, 11)?;
            let handler = event::Handler { mep: mep.0.clone() };
            let chardev_mep = mep.0.clone();
            Ok(try_pin_init!(&this in PcifabData {
                vectors,
                acs,
                mep,
                enabled,
                // The two `unsafe` of the driver outside `kext`, and why no safe way exists:
                // an IRQ vector borrows the `IrqVectorRegistration` for `'bound`, and the
                // handler registration must be dropped before the vectors are freed. Pin-init
                // gives no safe reference to a field already initialised in the same
                // allocation, so the borrow is made from `this`; and `irq::Registration::new()`
                // of the kernel crate is itself `unsafe` (its caller promises never to forget
                // the registration), which no wrapper can prove for a value it hands out.
                irq <- {
                    // `vectors` is initialised before this field (initialisers run in the
                    // order written), lives in the same pinned allocation as `irq`, and is
                    // dropped after it (fields drop in declaration order).
                    let vectors: &'bound pci::IrqVectorRegistration<'bound> =
                        // SAFETY: As above, the reference stays valid for as long as the
                        // registration that borrows it.
                        unsafe { &*core::ptr::addr_of!((*this.as_ptr()).vectors) };
                    let request = vectors.index(vector)?;
                    // SAFETY: The registration is pinned in the driver data and dropped with
                    // it; it is never forgotten.
                    unsafe {
                        irq::Registration::new(
                            request.into(),
                            irq::Flags::SHARED,
                            c"pcifab",
                            Ok::<_, Error>(handler),
                        )
                    }
                },
                dma_irq: match probe_step(pdev, 12).map(|()| dma_vector)? {
                    Some(v) => {
                        // As for `irq`: `vectors` is initialised before and dropped after.
                        let vectors: &'bound pci::IrqVectorRegistration<'bound> =
                            // SAFETY: As above.
                            unsafe { &*core::ptr::addr_of!((*this.as_ptr()).vectors) };
                        let request = vectors.index(v)?;
                        let handler = mrpc::DmaHandler { mep: chardev_mep.clone() };
                        Some(KBox::pin_init(
                            // SAFETY: The registration is pinned in its box, which the driver
                            // data owns and drops before `vectors`; it is never forgotten.
                            unsafe {
                                irq::Registration::new(
                                    request.into(),
                                    irq::Flags::SHARED,
                                    c"pcifab-mrpc",
                                    Ok::<_, Error>(handler),
                                )
                            },
                            GFP_KERNEL,
                        )?)
                    }
                    None => None,
                },
                chardev: {
                    probe_step(pdev, 13)?;
                    event::enable(&chardev_mep, true)?;
                    event::start_check(&chardev_mep);
                    probe_step(pdev, 14)?;
                    let registration = chardev::Registration::new(pdev.as_ref(), chardev_mep)?;
                    probe_step(pdev, 15)?;
                    registration
                },
            }))
        })
    }
}

impl PcifabDriver {
    /// Stops the event source and fails every waiter before the device goes away.
    fn quiesce(data: &PcifabData<'_>) {
        // Fail the running and queued firmware commands, then end every composition wait
        // (`ENODEV`); nothing here waits for a running composition operation.
        data.mep.mrpc.kill();
        data.mep.mrpc.dma_shut_down(&data.mep);
        let in_hotplug = data.mep.compose.shut_down();
        p2p::shut_down(&data.mep);
        let _ = event::enable(&data.mep, false);
        data.mep.events.shut_down();
        stop_work(&data.mep, in_hotplug);
    }
}

/// The module: the driver's workqueue, then the PCI driver. Fields drop in declaration order:
/// the driver is unregistered first (every endpoint unbound), then the workqueue is destroyed,
/// which waits for work an endpoint's removal did not wait for ([`stop_work`]).
#[pin_data]
struct PcifabModule {
    #[pin]
    _driver: kernel::driver::Registration<pci::Adapter<PcifabDriver>>,
    /// The switch's DMA endpoint ([`dmaep`]).
    #[pin]
    _dmaep: kernel::driver::Registration<pci::Adapter<dmaep::DmaEpDriver>>,
    _queue: kext::workqueue::ModuleQueue,
    /// The numbers of `/dev/pcifabN`; freed last.
    _numbers: NumbersGuard,
}

/// Gives the IDA of the character devices' numbers back on module exit.
struct NumbersGuard;

impl Drop for NumbersGuard {
    fn drop(&mut self) {
        chardev::destroy_numbers();
    }
}

impl kernel::InPlaceModule for PcifabModule {
    fn init(module: &'static kernel::ThisModule) -> impl PinInit<Self, Error> {
        kext::dmaep_registry::init();
        chardev::init_numbers();
        try_pin_init!(Self {
            // Made before the driver is registered: probe queues work on it.
            _queue: kext::workqueue::ModuleQueue::new()?,
            _driver <- kernel::driver::Registration::new(
                <Self as kernel::ModuleMetadata>::NAME,
                module,
            ),
            _dmaep <- kernel::driver::Registration::new(c"pcifab_dmaep", module),
            _numbers: NumbersGuard,
        })
    }
}

kernel::prelude::module! {
    type: PcifabModule,
    name: "pcifab",
    authors: ["pcifab developers"],
    description: "Management endpoint driver for multi-host PCIe switch fabrics",
    license: "GPL v2",
    params: {
        probe_fault_step: u32 {
            default: 0,
            description: "Testing aid: probe fails with ENOMEM at this step (1-15), undoing the steps before it; 0 (the default): never",
        },
        p2p_acs_relax: bool {
            default: false,
            description: "Clear ACS Request/Completion Redirect and Egress Control on this switch's downstream ports at probe (restored at remove), so P2P between functions bound here goes through the switch; weakens the isolation IOMMU groups were formed on (default: off, ACS as the kernel set it)",
        },
        removal_delay_ms: u32 {
            default: 0,
            description: "Testing aid: a graceful removal of a function waits this many milliseconds (at most 30000) before asking the slot's hot-plug driver; 0 (the default): none",
        },
    },
}

/// Longest [`removal_delay_ms`] honoured.
const MAX_REMOVAL_DELAY_MS: u32 = 30_000;

/// The `removal_delay_ms` module parameter, capped at [`MAX_REMOVAL_DELAY_MS`].
pub(crate) fn removal_delay_ms() -> u32 {
    module_parameters::removal_delay_ms
        .value()
        .min(MAX_REMOVAL_DELAY_MS)
}

/// The steps of probe that [`probe_step`] can fail, in order. Each failure must undo
/// everything the steps before it did (`pcifab-selftest probe-steps`).
const PROBE_STEPS: u32 = 15;

/// Fails probe with `ENOMEM` at step `n` when the `probe_fault_step` module parameter names
/// it: a failure injected into the driver's own probe, each step exactly once, where the
/// kernel's fault injection would also fail the kernel's code that probe calls.
fn probe_step(pdev: &pci::Device, n: u32) -> Result {
    if n <= PROBE_STEPS && module_parameters::probe_fault_step.value() == n {
        dev_notice!(
            pdev,
            "probe stopped at step {} as probe_fault_step asks\n",
            n
        );
        return Err(ENOMEM);
    }
    Ok(())
}
