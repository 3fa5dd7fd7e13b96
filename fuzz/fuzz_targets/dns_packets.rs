#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xcc_fuzz::entries::dns_packets(data));
