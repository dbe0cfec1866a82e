//! Batches the exporters' tests share.

use profcol_api::model::{ProfileMeta, ProfileRef, Resource};
use profcol_api::ProfilesBuilder;

/// One resource with a CPU profile (period 10 ns) and an
/// `off_cpu/nanoseconds` one, and a one-frame stack (`wait`, w.c:3): the
/// builder, the stack's index, the CPU profile, the off-CPU profile.
pub(crate) fn cpu_and_off_cpu() -> (ProfilesBuilder, i32, ProfileRef, ProfileRef) {
    let mut b = ProfilesBuilder::new();
    let f = b.function("wait", "wait", "w.c", 0);
    let leaf = b.line_location(f, 3);
    let stack = b.stack(&[leaf]);
    let r = b.resource(Resource::default());
    let cpu = b.profile(r, &ProfileMeta::cpu(10, 1_000, 5));
    let off = b.profile(
        r,
        &ProfileMeta {
            sample_type: ("off_cpu", "nanoseconds"),
            period_type: ("off_cpu", "nanoseconds"),
            period: 1,
            ..Default::default()
        },
    );
    (b, stack, cpu, off)
}

/// A `wakeup/nanoseconds` profile in the resource of [`cpu_and_off_cpu`]'s
/// batch (its first resource).
pub(crate) fn wakeup_profile(b: &mut ProfilesBuilder) -> ProfileRef {
    b.profile(
        0,
        &ProfileMeta {
            sample_type: ("wakeup", "nanoseconds"),
            period_type: ("wakeup", "nanoseconds"),
            period: 1,
            ..Default::default()
        },
    )
}
