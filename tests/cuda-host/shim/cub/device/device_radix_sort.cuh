/* cub's DeviceRadixSort::SortPairs on the host, for the cuda-host test:
 * the same contract (a stable sort of the pairs by bits [begin_bit,
 * end_bit) of the keys; a size query when d_temp_storage is NULL), done
 * at the call. The storage it asks for is one int per item, which it
 * uses, so a launcher that gives it less is caught. */
#ifndef RMOE_CUDA_HOST_CUB_RADIX_SORT
#define RMOE_CUDA_HOST_CUB_RADIX_SORT

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>

#include <cuda_runtime.h>

namespace cub {
struct DeviceRadixSort {
	template <typename K, typename V>
	static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes, const K *keys_in, K *keys_out,
	                             const V *values_in, V *values_out, int num_items, int begin_bit = 0,
	                             int end_bit = (int)(sizeof(K) * 8), cudaStream_t stream = 0)
	{
		(void)stream;
		const size_t need = (size_t)(num_items > 0 ? num_items : 1) * sizeof(int32_t);
		if (!d_temp_storage) {
			temp_storage_bytes = need;
			return cudaSuccess;
		}
		if (temp_storage_bytes < need || num_items < 0 || begin_bit < 0 || end_bit > (int)(sizeof(K) * 8) ||
		    begin_bit >= end_bit)
			return cudaErrorInvalidValue;
		/* A stable sort of the items by their digit, through the storage:
		 * the item at each place. */
		int32_t *item = (int32_t *)d_temp_storage;
		const uint64_t mask = end_bit - begin_bit >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << (end_bit - begin_bit)) - 1;
		auto digit = [&](int32_t i) { return ((uint64_t)keys_in[i] >> begin_bit) & mask; };
		for (int i = 0; i < num_items; i++)
			item[i] = i;
		std::stable_sort(item, item + num_items, [&](int32_t a, int32_t b) { return digit(a) < digit(b); });
		for (int i = 0; i < num_items; i++) {
			keys_out[i] = keys_in[item[i]];
			values_out[i] = values_in[item[i]];
		}
		return cudaSuccess;
	}
};
} // namespace cub

#endif
