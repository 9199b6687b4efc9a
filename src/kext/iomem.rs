// SPDX-License-Identifier: GPL-2.0-only

//! Revoking user-space mappings of a physical memory range.

use kernel::{bindings, prelude::*};

/// Revokes every user-space mapping of `[start, start + len)` (e.g. an `mmap` of a removed
/// function's sysfs `resourceN` file), so a process cannot reach whatever the fabric puts at
/// that address next. Claiming a range in the iomem tree makes the kernel zap the user
/// mappings of it (`CONFIG_IO_STRICT_DEVMEM`); the claim is released at once.
///
/// Returns `false` when the range could not be claimed (something in the kernel still owns
/// it); its mappings then stay.
pub(crate) fn revoke_user_mappings(start: u64, len: u64) -> bool {
    // SAFETY: `iomem_resource` is the kernel's static root of the iomem tree, and
    // `__request_region()` takes the resource lock itself; the name is a static string.
    let claimed = unsafe {
        bindings::__request_region(
            core::ptr::addr_of_mut!(bindings::iomem_resource),
            start,
            len,
            c"pcifab-revoke".as_char_ptr(),
            0,
        )
    };
    if claimed.is_null() {
        return false;
    }
    // SAFETY: The range was claimed just above and is released once.
    unsafe {
        bindings::__release_region(
            core::ptr::addr_of_mut!(bindings::iomem_resource),
            start,
            len,
        )
    };
    true
}
