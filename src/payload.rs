// SPDX-License-Identifier: GPL-2.0-only

//! Fixed-layout payloads: what the firmware and the driver exchange as bytes.
//!
//! [`payload!`] declares a `#[repr(C)]` struct, checks at compile time that it has the size
//! the public record gives it and no padding, and makes it [`FromBytes`] and [`AsBytes`];
//! [`Zeroed`] gives its all-zero value. The firmware commands (`fw`) and the mailbox
//! engine (`mrpc`, for the DMA MRPC completion record) are both built on it, so this module
//! sits below both and imports neither.

use kernel::transmute::{AsBytes, FromBytes};

/// A value every bit of which is zero; what a request starts from.
pub(crate) trait Zeroed: Sized {
    const ZEROED: Self;
}

macro_rules! impl_zeroed {
    ($($t:ty),*) => { $(impl Zeroed for $t { const ZEROED: Self = 0; })* };
}
impl_zeroed!(u8, u16, u32, u64, i32);

impl<T: Zeroed + Copy, const N: usize> Zeroed for [T; N] {
    const ZEROED: Self = [T::ZEROED; N];
}

/// Compiles only for types every byte pattern of which is valid and which have no padding.
// Used in `payload!`'s constants, which rustc 1.85 does not count as uses.
#[allow(dead_code)]
pub(crate) const fn assert_payload<T: FromBytes + AsBytes>() {}

/// Declares firmware payloads.
///
/// `struct Name[SIZE] { field: type, ... }` becomes a `#[repr(C)]` struct whose fields are
/// integers, integer arrays or other payloads, checked at compile time to be exactly `SIZE`
/// bytes, the sum of its fields (so it has no padding).
macro_rules! payload {
    ($(
        $(#[$m:meta])*
        $v:vis struct $name:ident[$size:expr] {
            $( $(#[$fm:meta])* $fv:vis $f:ident : $t:ty ),* $(,)?
        }
    )*) => {$(
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy)]
        $v struct $name { $( $(#[$fm])* $fv $f: $t ),* }

        const _: () = {
            $( $crate::payload::assert_payload::<$t>(); )*
            assert!(::core::mem::size_of::<$name>() == $size);
            assert!(::core::mem::size_of::<$name>() == 0 $( + ::core::mem::size_of::<$t>() )*);
        };

        // SAFETY: `$name` is `#[repr(C)]`, every field is `FromBytes` (checked above), and
        // its size is the sum of its fields' sizes (checked above), so any byte pattern of
        // that size is a valid value.
        unsafe impl ::kernel::transmute::FromBytes for $name {}
        // SAFETY: Every field is `AsBytes` and, with no room for padding (checked above), every
        // byte of a value is initialised.
        unsafe impl ::kernel::transmute::AsBytes for $name {}

        impl $crate::payload::Zeroed for $name {
            const ZEROED: Self = Self { $( $f: <$t as $crate::payload::Zeroed>::ZEROED ),* };
        }
    )*};
}
pub(crate) use payload;
