//! Every `#[repr(C)]` struct of this crate against the C compiler's layout of
//! the same struct in moe_ep_c.h (build.rs runs the C probe).
use moe_ep_sys::*;
use std::collections::BTreeMap;
use std::mem::{align_of, offset_of, size_of};

const PROBE: &str = include_str!(concat!(env!("OUT_DIR"), "/layout.txt"));

fn probe() -> BTreeMap<(String, String), (usize, usize)> {
    let mut map = BTreeMap::new();
    for line in PROBE.lines().filter(|l| !l.trim().is_empty()) {
        assert!(!line.starts_with("error"), "the C layout probe did not run: {line}");
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 4, "bad probe line {line:?}");
        map.insert((f[0].to_string(), f[1].to_string()), (f[2].parse().unwrap(), f[3].parse().unwrap()));
    }
    map
}

fn field_size<S, F>(_: fn(&S) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! check_struct {
    ($seen:ident, $map:ident, $t:ident { $($f:ident),* $(,)? }) => {{
        let name = stringify!($t);
        let (size, align) = $map.get(&(name.to_string(), "sizeof".to_string()))
            .copied().unwrap_or_else(|| panic!("{name} missing from the probe"));
        assert_eq!(size_of::<$t>(), size, "sizeof {name}");
        assert_eq!(align_of::<$t>(), align, "alignof {name}");
        $seen.insert((name.to_string(), "sizeof".to_string()));
        $(
            let key = (name.to_string(), stringify!($f).to_string());
            let (off, sz) = $map.get(&key).copied()
                .unwrap_or_else(|| panic!("{name}.{} missing from the probe", stringify!($f)));
            assert_eq!(offset_of!($t, $f), off, "offset of {name}.{}", stringify!($f));
            assert_eq!(field_size(|s: &$t| &s.$f), sz, "size of {name}.{}", stringify!($f));
            $seen.insert(key);
        )*
    }};
}

#[test]
fn structs_match_the_c_header() {
    let map = probe();
    let mut seen = std::collections::BTreeSet::new();
    check_struct!(seen, map, moe_ep_device_t { device_type, device_id });
    check_struct!(seen, map, moe_ep_dtype_t { code, bits, lanes });
    check_struct!(seen, map, moe_ep_tensor_t { data, device, ndim, dtype, shape, strides, byte_offset });
    check_struct!(seen, map, moe_ep_bootstrap_t { struct_size, rank, world_size, ctx, allgather, barrier });
    check_struct!(seen, map, moe_ep_params_t {
        struct_size, num_experts, top_k, max_tokens_per_rank, hidden_size, hidden_dtype, hidden_row_elems,
        scale_row_elems, scale_dtype, invalid_expert_id, enable_eplb_stats, combine_dtype
    });
    check_struct!(seen, map, moe_ep_config_t {
        struct_size, backend, num_sms, timeout_ms, device, zero_copy_combine, micro_batches, failure_policy, rejoin,
        store_address, store_prefix
    });
    check_struct!(seen, map, moe_ep_dispatch_args_t {
        struct_size, hidden_states, topk_ids, topk_weights, hidden_states_scale, runtime_max_tokens_per_rank,
        eplb_local_stats
    });
    check_struct!(seen, map, moe_ep_dispatch_result_t {
        struct_size, tokens_per_rank, hidden_states, topk_ids, topk_weights, hidden_states_scale, recv_counts,
        local_expert_counts, eplb_gathered_stats, combine_input
    });
    check_struct!(seen, map, moe_ep_combine_result_t { struct_size, output });
    check_struct!(seen, map, moe_ep_health_t { struct_size, status, failed_rank, active_count, mask_epoch });
    // Nothing the probe reports is left unchecked.
    let all: std::collections::BTreeSet<_> = map.keys().cloned().collect();
    assert_eq!(seen, all);
}

#[test]
fn version_constants_match_the_header_and_the_library() {
    let header = include_str!("../../../../include/moe_ep_c.h");
    for (name, value) in [("MAJOR", MOE_EP_VERSION_MAJOR), ("MINOR", MOE_EP_VERSION_MINOR),
                          ("PATCH", MOE_EP_VERSION_PATCH)] {
        let needle = format!("#define MOE_EP_VERSION_{name} {value}\n");
        assert!(header.contains(&needle), "header lacks {needle:?}");
    }
    let (mut a, mut b, mut c) = (-1, -1, -1);
    assert_eq!(unsafe { moe_ep_get_version(&mut a, &mut b, &mut c) }, MOE_EP_SUCCESS);
    assert_eq!((a, b, c), (MOE_EP_VERSION_MAJOR, MOE_EP_VERSION_MINOR, MOE_EP_VERSION_PATCH));
}

#[test]
fn init_functions_fill_struct_size_and_defaults() {
    let mut p = moe_ep_params_t::default();
    assert_eq!(unsafe { moe_ep_params_init(&mut p, std::mem::size_of_val(&p)) }, MOE_EP_SUCCESS);
    assert_eq!(p.struct_size as usize, size_of::<moe_ep_params_t>());
    assert_eq!(p.invalid_expert_id, -1);
    assert_eq!((p.hidden_dtype.code, p.hidden_dtype.bits), (MOE_EP_DTYPE_BFLOAT, 16));
    let mut c = moe_ep_config_t::default();
    assert_eq!(unsafe { moe_ep_config_init(&mut c, std::mem::size_of_val(&c)) }, MOE_EP_SUCCESS);
    assert_eq!(c.struct_size as usize, size_of::<moe_ep_config_t>());
    assert_eq!((c.backend, c.device), (MOE_EP_BACKEND_AUTO, -1));
    assert!(c.timeout_ms > 0);
    let mut h = moe_ep_health_t { failed_rank: 7, mask_epoch: 9, ..Default::default() };
    assert_eq!(unsafe { moe_ep_health_init(&mut h, std::mem::size_of_val(&h)) }, MOE_EP_SUCCESS);
    assert_eq!(h.struct_size as usize, size_of::<moe_ep_health_t>());
    assert_eq!((h.status, h.failed_rank, h.active_count, h.mask_epoch), (MOE_EP_SUCCESS, -1, 0, 0));
}
