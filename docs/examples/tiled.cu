/*
 * tiled.cu: the course's shared-memory kernel.
 *
 * A block computes one TILE_WIDTH x TILE_WIDTH tile of P. It walks the row of
 * tiles of M and the column of tiles of N: each thread copies one element of
 * each into shared memory, the block synchronises, and every thread adds the
 * TILE_WIDTH products of its row of Mds and column of Nds. Each element of M
 * and N is read from global memory once per block instead of once per thread.
 *
 * TILE_WIDTH is defined only where the compiler was not given it (#ifndef):
 * mmd compiles the file once per tile with -DTILE_WIDTH=T. A file that
 * defines it unguarded runs only at the tile it fixes. The signature is the
 * square one mmd knows, so no declaration is needed.
 */
#include <cuda_runtime.h>

#ifndef TILE_WIDTH
#define TILE_WIDTH 32
#endif

__global__ void MatrixMulKernel(float* Md, float* Nd, float* Pd, int Width) {
    __shared__ float Mds[TILE_WIDTH][TILE_WIDTH];
    __shared__ float Nds[TILE_WIDTH][TILE_WIDTH];

    int bx = blockIdx.x;
    int by = blockIdx.y;
    int tx = threadIdx.x;
    int ty = threadIdx.y;

    // the element of Pd this thread computes
    int Row = by * TILE_WIDTH + ty;
    int Col = bx * TILE_WIDTH + tx;

    float Pvalue = 0;
    // loop over the tiles of Md and Nd needed for the tile of Pd
    for (int m = 0; m < Width / TILE_WIDTH; ++m) {
        Mds[ty][tx] = Md[Row * Width + (m * TILE_WIDTH + tx)];
        Nds[ty][tx] = Nd[(m * TILE_WIDTH + ty) * Width + Col];
        __syncthreads();

        for (int k = 0; k < TILE_WIDTH; ++k) {
            Pvalue += Mds[ty][k] * Nds[k][tx];
        }
        __syncthreads();
    }
    Pd[Row * Width + Col] = Pvalue;
}
