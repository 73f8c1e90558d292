/*
 * granularity.cu: the P-last assignment's granularity option (A level):
 * each thread computes 4 elements of the solution matrix.
 *
 * A block of TILE_WIDTH x TILE_WIDTH threads computes a 2*TILE_WIDTH square
 * of Pd. Thread (ty, tx) owns rows Row and Row + TILE_WIDTH and columns Col
 * and Col + TILE_WIDTH. Each step loads a 2*TILE_WIDTH square of Md and of Nd
 * into shared memory, 4 values of each per thread, then updates the 4 sums.
 * Each output's sum still runs over k in order, one product at a time.
 *
 * The geometry is not one output per thread, so the file declares it: a block
 * covers 2T rows and 2T columns of Pd and walks K 2T at a time (mmd pads the
 * size to a multiple of 2T), 4 outputs per thread.
 *
 * mmd:
 *   block_tile: [2*T, 2*T, 2*T]
 *   outputs_per_thread: 4
 *   shared_bytes: 2 * (2*T) * (2*T) * 4
 */
#include <cuda_runtime.h>

__global__ void MatrixMulKernel(float* Md, float* Nd, float* Pd, int Width) {
    __shared__ float Mds[2 * TILE_WIDTH][2 * TILE_WIDTH];
    __shared__ float Nds[2 * TILE_WIDTH][2 * TILE_WIDTH];

    int tx = threadIdx.x;
    int ty = threadIdx.y;
    int Row = blockIdx.y * 2 * TILE_WIDTH + ty;
    int Col = blockIdx.x * 2 * TILE_WIDTH + tx;

    float P00 = 0, P01 = 0, P10 = 0, P11 = 0;
    for (int m = 0; m < Width / (2 * TILE_WIDTH); ++m) {
        int k0 = m * 2 * TILE_WIDTH;
        // each thread loads 4 values of the tile of Md and 4 of the tile of Nd
        for (int i = 0; i < 2; ++i) {
            for (int j = 0; j < 2; ++j) {
                Mds[ty + i * TILE_WIDTH][tx + j * TILE_WIDTH] =
                    Md[(Row + i * TILE_WIDTH) * Width + k0 + tx + j * TILE_WIDTH];
                Nds[ty + i * TILE_WIDTH][tx + j * TILE_WIDTH] =
                    Nd[(k0 + ty + i * TILE_WIDTH) * Width + Col + j * TILE_WIDTH];
            }
        }
        __syncthreads();

        // process the tile: the 4 values of the solution matrix are updated
        for (int k = 0; k < 2 * TILE_WIDTH; ++k) {
            float m0 = Mds[ty][k];
            float m1 = Mds[ty + TILE_WIDTH][k];
            float n0 = Nds[k][tx];
            float n1 = Nds[k][tx + TILE_WIDTH];
            P00 += m0 * n0;
            P01 += m0 * n1;
            P10 += m1 * n0;
            P11 += m1 * n1;
        }
        __syncthreads();
    }
    Pd[Row * Width + Col] = P00;
    Pd[Row * Width + Col + TILE_WIDTH] = P01;
    Pd[(Row + TILE_WIDTH) * Width + Col] = P10;
    Pd[(Row + TILE_WIDTH) * Width + Col + TILE_WIDTH] = P11;
}
