//! Info pages: grant references packed into granted pages.
//!
//! A request that has to name more grants than fit in a slot names instead the info pages
//! that list them. An info page is 4096 bytes holding up to [`INFO_PAGE_REFS`] little-endian
//! `u32` grant references, densely from offset 0; the request carries the count, and bytes
//! past the last reference are zero.

use super::GrantRef;
use crate::{Error, Result};

/// Size of an info page.
pub const INFO_PAGE_SIZE: usize = 4096;
/// Grant references one info page holds.
pub const INFO_PAGE_REFS: usize = INFO_PAGE_SIZE / 4;

/// Info pages needed for `nr_refs` references.
pub const fn info_pages_for(nr_refs: usize) -> usize {
    nr_refs.div_ceil(INFO_PAGE_REFS)
}

/// Write `refs` into `page` (at least [`INFO_PAGE_SIZE`] bytes), zeroing the rest of it.
pub fn pack_info_page(refs: &[GrantRef], page: &mut [u8]) -> Result<()> {
    if refs.len() > INFO_PAGE_REFS {
        return Err(Error::Invalid {
            field: "info page refs",
            reason: "more than 1024 references",
        });
    }
    if page.len() < INFO_PAGE_SIZE {
        return Err(Error::BufferTooSmall {
            needed: INFO_PAGE_SIZE,
            have: page.len(),
        });
    }
    let page = &mut page[..INFO_PAGE_SIZE];
    page.fill(0);
    for (chunk, r) in page.chunks_exact_mut(4).zip(refs) {
        chunk.copy_from_slice(&r.to_le_bytes());
    }
    Ok(())
}

/// Read the first `count` references of an info page (already copied out of shared memory).
pub fn unpack_info_page(page: &[u8], count: usize) -> Result<Vec<GrantRef>> {
    if count > INFO_PAGE_REFS {
        return Err(Error::Invalid {
            field: "info page refs",
            reason: "more than 1024 references",
        });
    }
    let bytes = count * 4;
    let body = page.get(..bytes).ok_or(Error::Truncated {
        needed: bytes,
        have: page.len(),
    })?;
    Ok(body
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Pack any number of references into as many info pages as they need.
pub fn pack_info_pages(refs: &[GrantRef]) -> Vec<[u8; INFO_PAGE_SIZE]> {
    refs.chunks(INFO_PAGE_REFS)
        .map(|chunk| {
            let mut page = [0u8; INFO_PAGE_SIZE];
            for (slot, r) in page.chunks_exact_mut(4).zip(chunk) {
                slot.copy_from_slice(&r.to_le_bytes());
            }
            page
        })
        .collect()
}

/// Read `count` references spread over `pages`, which must be exactly the
/// [`info_pages_for`]`(count)` pages that hold them.
pub fn unpack_info_pages<P: AsRef<[u8]>>(pages: &[P], count: usize) -> Result<Vec<GrantRef>> {
    if pages.len() != info_pages_for(count) {
        return Err(Error::Invalid {
            field: "info pages",
            reason: "page count does not match the reference count",
        });
    }
    let mut refs = Vec::with_capacity(count);
    let mut left = count;
    for page in pages {
        let here = left.min(INFO_PAGE_REFS);
        refs.extend(unpack_info_page(page.as_ref(), here)?);
        left -= here;
    }
    Ok(refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_layout_is_dense_little_endian() {
        let mut page = vec![0xaau8; INFO_PAGE_SIZE];
        pack_info_page(&[0x0403_0201, 7, u32::MAX], &mut page).unwrap();
        assert_eq!(
            &page[..12],
            &[1, 2, 3, 4, 7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]
        );
        assert!(page[12..].iter().all(|&b| b == 0));
        assert_eq!(
            unpack_info_page(&page, 3).unwrap(),
            vec![0x0403_0201, 7, u32::MAX]
        );
    }

    #[test]
    fn bounds_are_enforced() {
        let mut page = vec![0u8; INFO_PAGE_SIZE];
        let full: Vec<u32> = (0..1024).collect();
        pack_info_page(&full, &mut page).unwrap();
        assert_eq!(unpack_info_page(&page, 1024).unwrap(), full);
        let too_many: Vec<u32> = (0..1025).collect();
        assert!(matches!(
            pack_info_page(&too_many, &mut page),
            Err(Error::Invalid { .. })
        ));
        assert!(matches!(
            unpack_info_page(&page, 1025),
            Err(Error::Invalid { .. })
        ));
        assert_eq!(
            pack_info_page(&[1], &mut page[..4095]),
            Err(Error::BufferTooSmall {
                needed: 4096,
                have: 4095
            })
        );
        assert_eq!(
            unpack_info_page(&page[..7], 2),
            Err(Error::Truncated { needed: 8, have: 7 })
        );
    }

    #[test]
    fn many_pages_round_trip() {
        assert_eq!(info_pages_for(0), 0);
        assert_eq!(info_pages_for(1), 1);
        assert_eq!(info_pages_for(1024), 1);
        assert_eq!(info_pages_for(1025), 2);
        let refs: Vec<u32> = (0..2500).map(|i| i * 3 + 1).collect();
        let pages = pack_info_pages(&refs);
        assert_eq!(pages.len(), 3);
        assert_eq!(unpack_info_pages(&pages, refs.len()).unwrap(), refs);
        assert!(matches!(
            unpack_info_pages(&pages[..2], refs.len()),
            Err(Error::Invalid { .. })
        ));
        assert!(pack_info_pages(&[]).is_empty());
        assert_eq!(
            unpack_info_pages::<[u8; 4096]>(&[], 0).unwrap(),
            Vec::<u32>::new()
        );
    }
}
