/*
 * naive.cu: the course's first kernel, as given in the lecture.
 *
 * One thread computes one element of P: the dot product of a row of M and a
 * column of N, read straight from global memory. Threads are launched in
 * TILE_WIDTH x TILE_WIDTH blocks; threadIdx.x runs along P's columns.
 *
 * mmd knows this signature without a word (square: M, N, P, Width) and
 * launches it one thread per output in T x T blocks, grid x over columns and
 * y over rows. There are no bounds checks: mmd pads M and N to a size that is
 * a multiple of the tile and crops P, which changes no bit of the result.
 */
#include <cuda_runtime.h>
#include <stdio.h>

__global__ void MatrixMulKernel(float* M, float* N, float* P, int Width) {
    int Row = blockIdx.y * blockDim.y + threadIdx.y;  // the row of P and of M
    int Col = blockIdx.x * blockDim.x + threadIdx.x;  // the column of P and of N
    float Pvalue = 0;
    for (int k = 0; k < Width; ++k) {
        Pvalue += M[Row * Width + k] * N[k * Width + Col];
    }
    P[Row * Width + Col] = Pvalue;
}
