//! (being written: qemu-storage-daemon and its QMP client)
